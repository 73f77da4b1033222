"""OpenVINO as a peer: the same checkpoint exported by optimum-intel and compressed by NNCF, on the CPU.

optimum-intel pins an older transformers than hotrod's, so it runs in a Python environment of its own
(`make peers` builds one): the harness finds that environment's Python in `HOTROD_OPENVINO_PYTHON`, or
uses its own where optimum-intel imports beside hotrod, and drives `workers/openvino_worker.py` there.

Systems: weight-only int8 and int4 (NNCF's weight compression, what optimum-intel offers for language
models); for encoders, the fp32 export as optimum-intel gives it, weight-only int8, and NNCF's full int8
quantization (weights and activations), calibrated on rows shaped like the case's. An encoder with a head
(question answering, classification and reranking, token classification) is exported with it, by
optimum-intel's class for the task, and the harness turns its logits into what PyTorch's user gets
(`runners.head_answer`: the same span search, the same scores), inside the timed call as for PyTorch.
Each is converted once and kept under hotrod's cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from hotrod.bench.case import Case
from hotrod.bench.remote import Worker, environment_problem
from hotrod.bench.runners import System, head_answer
from hotrod.source import cache_dir, source_fingerprint

ENVIRONMENT = "HOTROD_OPENVINO_PYTHON"
# Each format, and the hotrod precision whose hardware floor it is held to. The bench times, for language
# models, the compressed weights (fp32 is the reference the tests compare tokens with); for encoders, whose
# matrix work is compute bound, fp32 (what an export gives without options), the same export computed in bf16
# (the CPU plugin's own default where the CPU has AVX-512 BF16 or AMX, fp32 elsewhere) and both int8 paths.
FORMATS = {"fp32": "fp32", "bf16": "bf16-products", "int8": "int8-weight", "int4": "int4", "int8-full": "int8-static"}
_TIMED = {True: ("int8", "int4"), False: ("fp32", "bf16", "int8", "int8-full")}  # by whether the kind generates
_EXPORTED_AS = {"bf16": "fp32"}  # formats that compute another's export in another precision


def python() -> str | None:
    """The Python that runs OpenVINO: `HOTROD_OPENVINO_PYTHON`, or this one where optimum-intel is here."""
    named = os.environ.get(ENVIRONMENT)
    if named:
        return named
    return sys.executable if importlib.util.find_spec("optimum") and _has_intel() else None


def problem(device: str) -> str | None:
    """Why OpenVINO cannot be timed here, or None."""
    if device != "cpu":
        return "OpenVINO is timed on the CPU only (its GPU plugin runs on Intel GPUs)"
    return environment_problem(ENVIRONMENT, python(), "optimum.intel", "optimum-intel pins an older transformers",
                               "pip install 'optimum-intel[openvino]'")


def builders(case: Case, ids: torch.Tensor, mask: torch.Tensor, threads: int) -> dict[str, Callable[[], System]]:
    """One builder per format, named "openvino <format>"; each converts (once), loads and compiles."""
    return {f"openvino {name}": _builder(case, ids, mask, threads, name) for name in _TIMED[case.spec.generates]}


def _builder(case: Case, ids: torch.Tensor, mask: torch.Tensor, threads: int, name: str) -> Callable[[], System]:
    def build() -> System:
        target = converted_path(case.source, case.kind, _EXPORTED_AS.get(name, name), case.task)
        worker = Worker(python(), "openvino_worker.py", target.with_name(target.name + ".log"))
        types = case.token_types(mask)
        try:
            # The worker runs without hotrod: what it must know of the kind travels with the call.
            info = worker.build(kind=case.kind, generates=case.spec.generates, pads_left=case.spec.pads_left,
                                source=case.source, precision=name, target=str(target), threads=threads,
                                ids=ids.cpu().numpy(), mask=mask.cpu().numpy(), new_tokens=case.new_tokens,
                                task=case.task, types=None if types is None else types.cpu().numpy(),
                                generate_kwargs=case.generate_kwargs())
        except BaseException:
            worker.close()
            raise
        if case.spec.generates:
            call, first = worker.call, (lambda: worker.call(first=True))
        else:
            call, first = (lambda: head_answer(worker.outputs(), case.task, mask)), None
        return System(call, first, FORMATS[name], info["size_bytes"],
                      figures={"format": name, "version": info["version"]}, close=worker.close)

    return build


def converted_path(source: str, kind: str, name: str, task: str | None = None) -> Path:
    """Where the checkpoint converted to `name`, with its `task` head, is kept (the worker builds it there once)."""
    tag = f"{source_fingerprint(Path(source))}|{kind}|{name}" + (f"|{task}" if task else "")
    digest = hashlib.sha256(tag.encode()).hexdigest()[:16]
    return cache_dir() / "bench" / "openvino" / f"{Path(source).name}-{name}-{digest}"


def _has_intel() -> bool:
    try:
        return importlib.util.find_spec("optimum.intel") is not None
    except ModuleNotFoundError:
        return False
