"""`hotrod bench`: hotrod's precisions side by side with its peers on the same weights, in one run.

A run is a list of cases (the workloads of benchmarks/WORKLOADS.md, or a batch x sequence sweep over any model)
and a list of systems (PyTorch eager, the baseline; hotrod at each precision; the peers of
`hotrod.bench.peers`), on the CPU or a CUDA GPU. Every case builds and warms up every system, then times
them interleaved, with the machine left to settle between calls, and reports latency percentiles, time
to first token and throughput, each system's time as a multiple of the hardware floor
(`hotrod.bench.floor`), memory, artifact size and agreement with PyTorch. A system that cannot run here
(a precision the device lacks, a peer that fails to convert or compile) is skipped with its reason and
the run goes on. Results are written as they come, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hotrod import precisions, tasks
from hotrod.bench import peers as peer_systems
from hotrod.bench.case import Case
from hotrod.bench.device import check_device, gpu_figures, gpu_start, ort_has_cuda
from hotrod.bench.floor import Machine, forward_floor, generation_floor, machine, matmul_params
from hotrod.bench.ops import MAX_BATCH, MAX_RUNS
from hotrod.bench.runners import System, agreement, dir_size, hotrod_runner, pytorch_model, pytorch_runner
from hotrod.bench.workloads import WORKLOADS, checkpoint
from hotrod.errors import HotrodError, first_line
from hotrod.files import write_whole
from hotrod.kinds import spec as kind_spec
from hotrod.options import PRECISIONS, check_choice
from hotrod.runtime import kernel_choice
from hotrod.source import cache_dir, open_source
from hotrod.timing import SETTLE_S, interleaved, synchronized

MAX_SETTLE_S = 10.0  # idle seconds before a timed run, at most

PEERS = peer_systems.PEERS
DEFAULT_NEW_TOKENS = 32
REPORT_FILES = ("report.md", "speedup.png", "latency_vs_batch.png", "latency_vs_seq.png")  # `report`'s
missing_peers = peer_systems.missing_peers


@dataclass
class Result:
    case: dict
    systems: dict[str, dict] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def portable_source(source: str) -> str:
    """A workload checkpoint's path as results record it: under hotrod's cache, named from there, so a
    committed result names no one machine's folders."""
    try:
        return f"<hotrod cache>/{Path(source).resolve().relative_to(cache_dir().resolve()).as_posix()}"
    except ValueError:
        return source


def workload_cases(ids: Sequence[str]) -> list[Case]:
    unknown = [wid for wid in ids if wid not in WORKLOADS]
    if unknown:  # before any workload's checkpoint is built
        raise HotrodError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    cases = []
    for wid in ids:
        w = WORKLOADS[wid]
        kind = {"generate": None, "forward": "encoder"}[w.task]
        source = str(checkpoint(w, cache_dir() / "bench" / "checkpoints"))
        if kind is None:
            src = open_source(source)
            kind = src.family.kind_of(src.config)
        shapes = ([(f"{wid}-{s.suffix}", s.lengths, s.num_beams) for s in w.shapes]
                  or [(f"{wid}-b{b}", w.lengths * b, w.num_beams) for b in w.batches]
                  or [(wid, w.lengths, w.num_beams)])
        cases += [Case(name, source, kind, lengths, w.new_tokens, w.head, w.query, beams)
                  for name, lengths, beams in shapes]
    return cases


def sweep_cases(source: str, batches: Sequence[int], seqs: Sequence[int], new_tokens: int | None) -> list[Case]:
    """Every batch x sequence length on one model, with the head its checkpoint names (its task's `bench`
    comparison); an impossible shape, or --new-tokens for a model that does not generate, is refused before
    any run. `new_tokens` None: 32 for a language model."""
    src = open_source(source)
    dims = src.family.dims(src.config)
    kind = src.family.kind_of(src.config)  # a BART classifier runs as an encoder
    spec = kind_spec(kind)
    for value, name, high in [(b, "--batch", MAX_BATCH) for b in batches] + [(s, "--seq", None) for s in seqs]:
        if value < 1 or (high is not None and value > high):
            raise HotrodError(f"{name} values must be within 1..{high or 'the positions'}, got {value}")
    _check_once("--batch", list(batches))
    _check_once("--seq", list(seqs))
    if not spec.generates and new_tokens is not None:
        raise HotrodError(f"--new-tokens applies to language models; {source} is a {kind} model")
    new_tokens = DEFAULT_NEW_TOKENS if new_tokens is None else new_tokens
    if spec.generates and new_tokens < 1:
        raise HotrodError("--new-tokens must be >= 1 for a language model")
    task = _head(src)
    limit = dims.max_positions
    for seq in seqs:
        if limit is not None and spec.needs_positions(seq, new_tokens) > limit:
            raise HotrodError(f"--seq {seq}{' + --new-tokens ' + str(new_tokens) if spec.room(new_tokens) else ''} "
                              f"is longer than the model's {limit} positions")
    return [Case(f"b{b}-s{s}", str(src.path), kind, (s,) * b, new_tokens if spec.generates else 0, task)
            for b in batches for s in seqs]


def _head(src: Any) -> str | None:
    """The head a swept checkpoint runs (None: its bare model), refused where the bench cannot compare it."""
    task = tasks.task_of(src.config, src.family)
    spec = tasks.get(task)
    if spec.bare:
        return None
    if spec.bench is None:
        raise HotrodError(f"hotrod bench has no comparison for a {task} head; time it with hotrod profile")
    return task


def _check_once(flag: str, values: Sequence[Any]) -> None:
    """A list option names each value once: a repeat would time one system (or case) as two."""
    repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if repeated is not None:
        raise HotrodError(f"{flag} names {repeated} twice")


def check_out(out: str) -> Path:
    """The results folder, refused before anything is measured: empty, or a file where a folder goes."""
    if not out.strip():
        raise HotrodError("--out must name a folder for results.json and report.md")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise HotrodError(f"--out {out} is a file, not a folder")
    return path


def check_options(precisions: Sequence[str], peers: Sequence[str], runs: int, device: str,
                  settle: float = SETTLE_S) -> None:
    """Refuses a bad option in one line before anything is built or loaded."""
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
        raise HotrodError(f"--runs must be a whole number within 1..{MAX_RUNS}, got {runs!r}")
    if isinstance(settle, bool) or not isinstance(settle, (int, float)) or not 0 <= settle <= MAX_SETTLE_S:
        raise HotrodError(f"--settle must be a number of seconds within 0..{MAX_SETTLE_S:g}, got {settle!r}")
    for precision in precisions:
        check_choice("precision", precision, PRECISIONS)
    for peer in peers:
        check_choice("peer", peer, PEERS)
    _check_once("--precision", precisions)
    _check_once("--peers", peers)
    check_device(device)


def run(cases: Sequence[Case], precisions: Sequence[str], peers: Sequence[str], runs: int, threads: int,
        out: Path, progress: bool = True, device: str = "cpu", settle: float = SETTLE_S) -> list[Result]:
    """Time every case on every system, each timed run after `settle` idle seconds (`hotrod.timing`); writes
    `out`/results.json after each case."""
    check_options(precisions, peers, runs, device, settle)
    idle = [peer for peer in peers if peer in peer_systems.RERANKERS] if not any(c.query for c in cases) else []
    if idle:  # a reranker beside some cases that rerank is skipped on the others, with its reason
        raise HotrodError(f"--peers {idle[0]} times reranking (W7) only, and none of these cases reranks")
    skipped = missing_peers(peers, device)
    plan = _Plan(precisions, [p for p in peers if p not in skipped], runs, threads, device,
                 machine(threads, device=device), progress, settle)
    out.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:  # an earlier run's report beside this run's results would read as one run
        (out / name).unlink(missing_ok=True)
    results: list[Result] = []
    planned = [case.name for case in cases]
    for case in cases:
        result = Result(case={**asdict(case), "source": portable_source(case.source), "device": device},
                        skipped=dict(skipped))
        _run_case(case, plan, result)
        results.append(result)
        write_json(results, plan.machine, out, planned, settle)
    return results


@dataclass
class _Plan:
    """What every case of a run shares; `artifacts` remembers hotrod's builds (or why one failed)."""

    precisions: Sequence[str]
    peers: Sequence[str]
    runs: int
    threads: int
    device: str
    machine: Machine
    progress: bool
    settle: float = SETTLE_S  # idle seconds before each timed run
    artifacts: dict[tuple[str, str], Path | HotrodError] = field(default_factory=dict)


def _run_case(case: Case, plan: _Plan, result: Result) -> None:
    reference = pytorch_model(case.source, case.kind, task=case.task)  # moved to the device by its builder
    ids, mask = case.inputs(reference.config.vocab_size, getattr(reference.config, "pad_token_id", None))
    device = plan.device
    builders: dict[str, _Builder] = {"pytorch": (functools.partial(_pytorch, reference, case, ids, mask, device), ())}
    for precision in plan.precisions:
        build = functools.partial(_hotrod, case, ids, mask, precision, plan)
        builders[f"hotrod {precision}"] = (build, (Exception,) if device == "cuda" else (HotrodError,))
    for peer in plan.peers:
        for name, build in peer_systems.builders(peer, case, ids, mask, device, plan.threads).items():
            builders[name] = (build, (Exception,))
    systems, outputs = _prepare(builders, device, result)
    try:
        _time(case, systems, outputs, plan, mask, reference, result)
    finally:
        for system in systems.values():
            _close(system)


# A system's builder, and the errors that skip it (with their reason) instead of ending the run.
_Builder = tuple[Callable[[], System], tuple[type[Exception], ...]]


def _prepare(builders: dict[str, _Builder], device: str, result: Result) -> tuple[dict[str, System], dict]:
    """Builds and warms up each system in turn: compiling, converting and first-call allocation are done
    here, untimed, and the warm-up's answer is the one compared with PyTorch's."""
    systems, outputs = {}, {}
    for name, (build, errors) in builders.items():
        start = gpu_start(device)
        system = None
        try:
            system = build()
            system.rss_bytes = _rss()
            system.call = synchronized(system.call, device)
            if system.first_token:
                system.first_token = synchronized(system.first_token, device)
                system.first_token()
            outputs[name] = system.call().cpu()
        except errors as exc:
            result.skipped[name] = _reason(exc)
            _close(system)
            continue
        system.figures.update(gpu_figures(device, start))
        systems[name] = system
    return systems, outputs


def _close(system: System | None) -> None:
    if system is not None and system.close is not None:
        system.close()


def _reason(exc: Exception) -> str:
    text = first_line(exc) if isinstance(exc, HotrodError) else f"{type(exc).__name__}: {first_line(exc)}"
    return text if len(text) <= 300 else text[:297] + "..."


def _pytorch(model: torch.nn.Module, case: Case, ids: torch.Tensor, mask: torch.Tensor, device: str) -> System:
    model.to(device)
    ids, mask = ids.to(device), mask.to(device)
    first = pytorch_runner(model, case.kind, ids, mask, _one_token(case)) if case.spec.generates else None
    types = case.token_types(mask)
    call = pytorch_runner(model, case.kind, ids, mask, case.generate_kwargs(), case.task,
                          None if types is None else types.to(device))
    return System(call, first, "fp32", dir_size(Path(case.source)))


def _hotrod(case: Case, ids: torch.Tensor, mask: torch.Tensor, precision: str, plan: _Plan) -> System:
    """hotrod at `precision`: its artifact on onnxruntime, or on CUDA without onnxruntime's CUDA provider,
    the checkpoint on hotrod's torch backend (fp32 only: that backend runs the checkpoint's weights)."""
    import hotrod

    if plan.device == "cuda" and not ort_has_cuda():
        if precisions.get(precision).converts:  # that backend runs the checkpoint's own weights
            raise HotrodError("this onnxruntime has no CUDAExecutionProvider, and hotrod's torch backend runs "
                              "fp32 only")
        model, path, backend = hotrod.load(case.source, backend="torch", device="cuda"), Path(case.source), "torch"
    else:
        key = (case.source, precision)
        if key not in plan.artifacts:
            try:
                plan.artifacts[key] = cached_artifact(case.source, precision, plan.device, plan.progress)
            except HotrodError as exc:  # remembered: the next case of this model is not built again to fail
                plan.artifacts[key] = exc
        if isinstance(plan.artifacts[key], HotrodError):
            raise plan.artifacts[key]
        path, backend = plan.artifacts[key], "onnxruntime"
        model = hotrod.load(path, device=plan.device, threads=plan.threads)  # refuses a silent CPU fallback
    first = hotrod_runner(model, ids, mask, _one_token(case)) if case.spec.generates else None
    call = hotrod_runner(model, ids, mask, case.generate_kwargs(), case.task, case.token_types(mask))
    # which of hotrod's CPU kernels ran, and which this machine's `hotrod tune` record left out
    ran = sorted(set().union(*getattr(model.backend, "kernel_ops", {}).values()))
    return System(call, first, precision, dir_size(path), figures={
        "backend": backend, "kernel_ops": ran,
        "kernels_left_out": sorted(kernel_choice.left_out(kernel_choice.artifact_key(Path(path))))})


def _one_token(case: Case) -> dict:
    return {**case.generate_kwargs(), "max_new_tokens": 1, "min_new_tokens": 1}


def cached_artifact(source: str | Path, precision: str, device: str = "cpu", progress: bool = False) -> Path:
    """`source` optimized at `precision` for `device`, built once under the hotrod cache. The folder is named
    by checkpoint, precision, device and code fingerprint, so the bench and the serving benchmarks reuse one
    another's builds and a change to the export code triggers a rebuild."""
    import hashlib

    import hotrod
    from hotrod.build.graphs import code_fingerprint

    built_for = "" if device == "cpu" else f"|{device}"
    tag = hashlib.sha256(f"{source}|{precision}{built_for}|{code_fingerprint()}".encode()).hexdigest()[:16]
    path = cache_dir() / "bench" / "artifacts" / f"{Path(source).name}-{precision}-{tag}"
    if not (path / "manifest.json").is_file():
        hotrod.optimize(source, path, precision=precision, device=device, force=True, progress=progress,
                        verify_examples=0)
    return path


def _time(case: Case, systems: dict[str, System], outputs: dict, plan: _Plan, mask: torch.Tensor, reference,
          result: Result) -> None:
    runs, m = plan.runs, plan.machine
    times = interleaved({name: s.call for name, s in systems.items()}, runs=runs, warmup=0, settle=plan.settle)
    first = {name: s.first_token for name, s in systems.items() if s.first_token is not None}
    first_times = interleaved(first, runs=runs, warmup=0, settle=plan.settle) if first else {}
    step, total = matmul_params(reference, case.kind)
    base = statistics.median(times["pytorch"])
    for name, system in systems.items():
        samples = times[name]
        p50 = statistics.median(samples)
        floor = _floor(case, system.precision, step, total, m)
        figures = {
            "precision": system.precision,
            "runs_s": samples,
            "p50_s": p50, "p90_s": _percentile(samples, 90), "p99_s": _percentile(samples, 99),
            "speedup": base / p50,
            "floor_s": floor,
            "times_floor": p50 / floor,
            "agreement": agreement(outputs[name], outputs["pytorch"], case.kind, mask, case.task),
            "size_bytes": system.size_bytes,
            "rss_bytes": system.rss_bytes,
            **system.figures,
        }
        if not case.spec.generates:
            figures["sequences_per_s"] = case.batch / p50
        else:
            figures["tokens_per_s"] = case.batch * case.new_tokens / p50
            figures["first_token_s"] = statistics.median(first_times[name])
        result.systems[name] = figures


def _floor(case: Case, precision: str, step: int, total: int, m: Machine) -> float:
    tokens = sum(case.lengths)
    if not case.spec.generates:
        return forward_floor(total, tokens, precision, m)
    # A batch reads the weights once per step for all its rows (and beams): the per-token traffic is shared.
    return generation_floor(step, total, tokens, case.new_tokens, precision, m, rows=case.batch * case.num_beams,
                            encoder_only=case.spec.encodes)


def _percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: the least sample with at least q% of them at or below it."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _rss() -> int:
    """This process's resident memory now, in bytes (Linux), read after a system is loaded."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    import os

    return pages * os.sysconf("SC_PAGE_SIZE")


def write_json(results: Sequence[Result], m: Machine, out: Path, planned: Sequence[str] | None = None,
               settle: float = SETTLE_S) -> Path:
    """results.json, written whole after each case: `planned` names every case of the run and `complete` says
    whether all are in, so a run cut short reads as such; `settle_s`, the idle seconds before each timed run."""
    planned = [r.case["name"] for r in results] if planned is None else list(planned)
    payload = {
        "machine": {**asdict(m), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "planned": planned,
        "complete": len(results) == len(planned),
        "settle_s": settle,
        "results": [asdict(r) for r in results],
    }
    return write_whole(out / "results.json", json.dumps(payload, indent=2) + "\n")
