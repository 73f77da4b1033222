"""The peers hotrod is timed against, beside PyTorch eager (the baseline, always timed).

- torch: the same transformers model under `torch.compile`, the way transformers itself offers it
  (a static KV cache and a compiled decoding step for generation; the compiled module for encoders).
- ctranslate2: the same checkpoint converted by CTranslate2 at fp32 and int8 (on the CPU its int8_float32),
  encoder-decoders translated greedily or with the case's beams (`hotrod.bench.ct2`).
- llamacpp: llama.cpp (through llama-cpp-python) on GGUF files written from the same weights, at Q8_0,
  Q4_0 and Q4_K_M (`hotrod.bench.llamacpp`).
- openvino: optimum-intel's export with NNCF's int8 / int4 weight compression, and for encoders (bare or
  with a head) fp32 and NNCF's full int8 quantization too, run in an environment of its own
  (`hotrod.bench.openvino_peer`).
- crossencoder: sentence-transformers' `CrossEncoder` on PyTorch (`hotrod.bench.rerank`), and infinity:
  Infinity's engine (`infinity-emb`) in an environment of its own (`hotrod.bench.infinity_peer`), for
  reranking (W7) only.
- optimum: optimum-onnx pins an older transformers than hotrod's, so it cannot share this environment;
  it is reported as skipped, with that reason.

Each peer hands the harness named builders; a builder that raises, or a system whose first call raises,
is skipped with a one-line reason and the run goes on.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hotrod.bench.case import Case
from hotrod.bench.runners import System, dir_size, pytorch_model, pytorch_runner
from hotrod.errors import HotrodError

PEERS = ("torch", "optimum", "ctranslate2", "llamacpp", "openvino", "crossencoder", "infinity")
_PEER_MODULES = {"optimum": "optimum.onnxruntime", "ctranslate2": "ctranslate2", "llamacpp": "llama_cpp",
                 "crossencoder": "sentence_transformers"}
RERANKERS = ("crossencoder", "infinity")  # peers that time reranking (W7) only
HEADLESS = ("ctranslate2", "llamacpp")  # peers whose bench systems run the bare model only
_INSTALL = {
    "ctranslate2": "pip install 'hotrod[bench]'",
    "crossencoder": "pip install 'hotrod[bench]'",
    "llamacpp": "pip install 'hotrod[peers]', which builds llama.cpp for this CPU",
    "optimum": "optimum-onnx pins an older transformers, so it needs a virtual environment of its own",
}
_OPTIMUM_SKIP = ("optimum-onnx pins an older transformers than hotrod's, so it is not timed in the same "
                 "process; time it in an environment of its own")


def missing_peers(peers: Sequence[str], device: str = "cpu") -> dict[str, str]:
    """Peers that cannot run here, with the reason (the run goes on without them)."""
    skipped = {}
    for peer in peers:
        if peer not in PEERS:
            raise HotrodError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
        module = _PEER_MODULES.get(peer)
        if module and importlib.util.find_spec(module.split(".")[0]) is None:
            skipped[peer] = f"not installed: no module {module} ({_INSTALL[peer]})"
        elif peer == "optimum":
            skipped[peer] = _OPTIMUM_SKIP
        elif peer == "openvino":
            from hotrod.bench import openvino_peer

            problem = openvino_peer.problem(device)
            if problem:
                skipped[peer] = problem
        elif peer == "infinity":
            from hotrod.bench import infinity_peer

            problem = infinity_peer.problem(device)
            if problem:
                skipped[peer] = problem
        elif peer == "llamacpp" and device != "cpu":
            skipped[peer] = "llama.cpp is timed on the CPU only (this llama-cpp-python is built for it)"
        elif peer == "ctranslate2" and device == "cuda":
            from hotrod.bench import ct2

            problem = ct2.cuda_problem()
            if problem:
                skipped[peer] = problem
    return skipped


def builders(peer: str, case: Case, ids: torch.Tensor, mask: torch.Tensor, device: str,
             threads: int) -> dict[str, Callable[[], System]]:
    """The systems `peer` adds to a case, by name, each built only when the harness asks; a peer that cannot
    run the case's head (or a reranker on another case) has one builder that fails with the reason."""
    if peer in RERANKERS:
        from hotrod.bench import rerank

        if not case.query:
            return {peer: rerank.rerank_only(peer)}
        if peer == "infinity":
            from hotrod.bench import infinity_peer

            return {peer: lambda: infinity_peer.system(case, ids, mask, threads)}
        return {peer: lambda: rerank.cross_encoder_system(case, ids, mask, device, threads)}
    if peer in HEADLESS and case.task:
        return {peer: _refuse(f"the bench's {peer} peer runs the bare model, not a {case.task} head")}
    if peer == "torch":
        return {"pytorch compiled": lambda: compiled_system(case, ids, mask, device)}
    if peer == "ctranslate2":
        from hotrod.bench import ct2

        return ct2.builders(case, ids, mask, device, threads)
    if peer == "openvino":
        from hotrod.bench import openvino_peer

        return openvino_peer.builders(case, ids, mask, threads)
    if peer == "llamacpp":
        from hotrod.bench import llamacpp

        return llamacpp.builders(case, ids, mask, threads)
    return {}


def _refuse(reason: str) -> Callable[[], System]:
    def build() -> System:
        raise HotrodError(reason)

    return build


def compiled_system(case: Case, ids: torch.Tensor, mask: torch.Tensor, device: str) -> System:
    """transformers' model under torch.compile; compiling happens in the harness's warm-up, not in timing.

    Generation uses transformers' own route: a static KV cache, so decoding steps keep one shape, and
    `compile_config`, which compiles the decoding step (the prompt's forward stays eager, as transformers
    chooses). Where transformers declines to compile, the system fails rather than time eager code.
    """
    problem = compiler_problem(device)
    if problem:
        raise RuntimeError(problem)
    model = pytorch_model(case.source, case.kind, device, case.task)  # its own copy: compiling must not touch the baseline
    ids, mask, size = ids.to(device), mask.to(device), dir_size(Path(case.source))
    if not case.spec.generates:
        types = case.token_types(mask)
        call = pytorch_runner(torch.compile(model), case.kind, ids, mask, task=case.task,
                              types=None if types is None else types.to(device))
        return System(_strict(call), None, "fp32", size)
    kwargs = {**case.generate_kwargs(), "cache_implementation": "static", "compile_config": _compile_config(device)}
    call = _strict(_checked(model, pytorch_runner(model, case.kind, ids, mask, kwargs)))
    first = pytorch_runner(model, case.kind, ids, mask, {**kwargs, "max_new_tokens": 1, "min_new_tokens": 1})
    return System(call, first, "fp32", size)


def compiler_problem(device: str) -> str | None:
    """Why torch.compile cannot work here, found before paying for a compilation; None if it may."""
    if device == "cpu":
        names = [os.environ.get("CXX", ""), "c++", "g++", "clang++"]
        if not any(name and shutil.which(name) for name in names):
            return "torch.compile on CPU needs a C++ compiler (c++, g++ or clang++), and none is on PATH"
    elif importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton, which is not installed"
    return None


def _compile_config(device: str):
    from transformers import CompileConfig

    config = CompileConfig(mode="reduce-overhead" if device == "cuda" else "default")
    if device == "cpu":
        config._compile_all_devices = True  # transformers compiles generate on accelerators unless told
    return config


def _strict(call: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """`call`, raising where torch would silently fall back to eager code after too many recompilations."""
    import torch._dynamo

    if not hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        return call
    return torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)(call)


def _checked(model: torch.nn.Module, call: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """`call`, refusing to stand for compiled code if transformers ran its decoding step eagerly."""
    def run() -> torch.Tensor:
        output = call()
        if not hasattr(model, "_compiled_call"):
            raise RuntimeError("transformers did not compile the decoding step (its generate ran eagerly)")
        return output

    return run
