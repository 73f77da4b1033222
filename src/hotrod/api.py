"""The Python API: `optimize` writes an artifact, `load` returns a drop-in model, `verify` measures an artifact
against its source.

The CLI is a thin layer over these functions; each stage's work is in its own room (`hotrod.build`,
`hotrod.runtime.assemble`, `hotrod.verification`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hotrod import artifact as art
from hotrod.build import static_engine
from hotrod.build.optimize import examples_origin, optimize
from hotrod.errors import HotrodError
from hotrod.model import HotrodModel
from hotrod.options import BACKENDS, DEVICES, check_choice
from hotrod.runtime.assemble import artifact_source, load_artifact, runtime_options, torch_model
from hotrod.runtime.base import RuntimeOptions
from hotrod.source import cache_dir, load_tokenizer, open_source, source_fingerprint
from hotrod.verification.compare import DEFAULT_EXAMPLES, compare, examples_for, measure
from hotrod.verification.examples import Example

__all__ = ["load", "optimize", "verify"]


def load(
    path_or_source: str | Path,
    backend: str | None = None,
    device: str | None = None,
    threads: int = 0,
    precision: str | None = None,
    static: bool | None = None,
    profile: bool = False,
    task: str | None = None,
) -> HotrodModel:
    """A drop-in model from an artifact, or from a checkpoint (exported on first use for onnxruntime).

    A checkpoint runs the head its `architectures` names, or `task` (`hotrod.tasks`); an artifact runs the
    task it was built for. `backend` is the artifact's when None (onnxruntime for a checkpoint).
    On the torch backend a GPU runs the static engine (`hotrod.runtime.static`), in `precision` (fp32,
    bf16, fp16, int8-weight, fp8; fp32 when not given); `static=True` runs it on a CPU too. A torch engine
    artifact (`hotrod optimize --backend torch`) runs it from its stored weights, in the precision and
    with the fp32 islands it was built with, on the device it was built for unless `device` says
    otherwise. `profile` has onnxruntime time every node (`hotrod.bench.ops.op_times` reads it; runs are
    slower meanwhile).
    """
    if backend is not None:
        check_choice("backend", backend, BACKENDS)
    if device is not None:
        check_choice("device", device, DEVICES)
    if art.is_artifact(path_or_source):
        artifact = art.open_artifact(path_or_source)
        if task is not None and task != artifact.manifest.get("task"):
            raise HotrodError(f"{path_or_source} was built for {artifact.manifest.get('task')}, not {task}; "
                              f"build it with hotrod optimize --task {task}")
        if static_engine.is_engine(artifact.manifest):
            return static_engine.load_artifact(artifact, backend, device, threads, precision, static, profile)
    backend = backend or "onnxruntime"
    options = runtime_options(backend, device or "cpu", threads, precision, static, profile)
    if art.is_artifact(path_or_source):
        return load_artifact(artifact, backend, device, threads, profile, options)
    src = open_source(path_or_source, task)
    if backend == "torch":
        return torch_model(src, options, load_tokenizer(src.path))
    built_for = options.device  # graphs differ by device (`hotrod.optimize.portable`)
    told = f"-{task}" if task else ""
    cached = cache_dir() / f"{src.family.name}-{source_fingerprint(src.path)[:20]}{told}-fp32"
    if built_for != "cpu":
        cached = cached.with_name(f"{cached.name}-{built_for}")
    try:
        artifact = art.open_artifact(cached)
    except HotrodError:  # not exported yet, or by an older hotrod, or damaged: export afresh
        optimize(src.origin if src.from_hub else src.path, cached, force=True, progress=sys.stderr.isatty(),
                 verify_examples=0, device=built_for, task=task)  # a cache for load(); `hotrod verify` measures it on request
        artifact = art.open_artifact(cached)
    return load_artifact(artifact, backend, device, threads, profile)


def verify(
    path: str | Path,
    against: str | Path | None = None,
    texts: str | Path | Sequence[str | Example] | None = None,
    examples: int = DEFAULT_EXAMPLES,
    max_new_tokens: int | None = None,
    threads: int = 0,
) -> dict:
    """Compare an artifact with its source model (or the checkpoint `against`); returns the figures.

    See `hotrod.verification.compare` for what is measured. `texts` is a file of examples in the task's format
    (`hotrod.verification.examples`), a list, or None for the built-in ones; the first `examples` are used.
    """
    if examples < 1:
        raise HotrodError(f"examples must be >= 1, got {examples}")
    if not art.is_artifact(path):
        raise HotrodError(f"{path} is not a hotrod artifact (no manifest.json); verify checks an artifact")
    artifact = art.open_artifact(path)
    if static_engine.is_engine(artifact.manifest):  # on the device it was built for where this machine has it
        built_for = artifact.manifest["options"].get("device", "cpu")
        device = built_for if static_engine.has_device(built_for) else "cpu"
        model = static_engine.load_artifact(artifact, None, device, threads, None, None, False)
    else:
        model = load_artifact(artifact, "onnxruntime", None, threads)
    chosen = examples_for(texts, measure(model), list(model.labels.values()))[:examples]
    src = artifact_source(artifact) if against is None else open_source(against, artifact.manifest.get("task"))
    if src.family.dims(src.config) != model.dims:
        raise HotrodError(f"{src.origin} is not the model of {path} (its dimensions differ)")
    reference = torch_model(src, RuntimeOptions(backend="torch", threads=threads), model.tokenizer)
    figures = compare(model, reference, chosen, max_new_tokens=max_new_tokens)
    return {"against": src.origin, "examples_from": examples_origin(texts), **figures}
