"""`hotrod bench`: hotrod's precisions side by side with its peers on the same weights, in one run.

A run is a list of cases (the workloads of WORKLOADS.md, or a batch x sequence sweep over any model)
and a list of systems (PyTorch eager, the baseline; hotrod at each precision; peers that are installed).
Every case times every system interleaved after a warm-up, with the machine left to settle between calls,
and reports latency percentiles, time to first token and throughput, each system's time as a multiple
of the hardware floor (`hotrod.bench.floor`), memory, artifact size and agreement with PyTorch.
Results are written as they come, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from hotrod.bench.floor import Machine, forward_floor, generation_floor, machine, matmul_params
from hotrod.bench.runners import agreement, hotrod_runner, pytorch_model, pytorch_runner
from hotrod.bench.timing import interleaved
from hotrod.bench.workloads import WORKLOADS, checkpoint
from hotrod.errors import HotrodError
from hotrod.load import cache_dir, open_source
from hotrod.options import PRECISIONS, check_choice

PEERS = ("torch", "optimum", "ctranslate2")
_PEER_MODULES = {"optimum": "optimum.onnxruntime", "ctranslate2": "ctranslate2"}
_INSTALL = {
    "ctranslate2": "pip install 'hotrod[bench]'",
    "optimum": "optimum-onnx pins an older transformers, so it needs a virtual environment of its own",
}


@dataclass(frozen=True)
class Case:
    """One shape to time: `lengths` are the prompt lengths of the batch's rows."""

    name: str
    source: str
    kind: str
    lengths: tuple[int, ...]
    new_tokens: int = 0

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def seq(self) -> int:
        return max(self.lengths)

    def inputs(self, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded ids; rows padded left for generation and right for encoders, as each side expects."""
        generator = torch.Generator().manual_seed(1234)
        ids = torch.zeros(self.batch, self.seq, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, length in enumerate(self.lengths):
            span = slice(self.seq - length, self.seq) if self.kind == "decoder" else slice(0, length)
            ids[row, span] = torch.randint(2, vocab_size, (length,), generator=generator)
            mask[row, span] = 1
        return ids, mask

    def generate_kwargs(self) -> dict | None:
        if self.kind == "encoder":
            return None
        return {"max_new_tokens": self.new_tokens, "min_new_tokens": self.new_tokens, "do_sample": False,
                "num_beams": 1}


@dataclass
class Result:
    case: dict
    systems: dict[str, dict] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def workload_cases(ids: Sequence[str]) -> list[Case]:
    cases = []
    for wid in ids:
        if wid not in WORKLOADS:
            raise HotrodError(f"unknown workload {wid!r}; choose from {', '.join(WORKLOADS)}")
        w = WORKLOADS[wid]
        kind = {"generate": None, "forward": "encoder"}[w.task]
        source = str(checkpoint(w, cache_dir() / "bench" / "checkpoints"))
        kind = kind or open_source(source).family.kind
        cases.append(Case(wid, source, kind, w.lengths, w.new_tokens))
    return cases


def sweep_cases(source: str, batches: Sequence[int], seqs: Sequence[int], new_tokens: int) -> list[Case]:
    """Every batch x sequence length on one model; an impossible shape is refused before any run."""
    src = open_source(source)
    dims = src.family.dims(src.config)
    kind = src.family.kind
    for value, name in [(b, "--batch") for b in batches] + [(s, "--seq") for s in seqs]:
        if value < 1:
            raise HotrodError(f"{name} values must be >= 1, got {value}")
    if kind != "encoder" and new_tokens < 1:
        raise HotrodError("--new-tokens must be >= 1 for a language model")
    limit = dims.max_positions
    for seq in seqs:
        total = seq + (new_tokens if kind == "decoder" else 0)
        if limit is not None and total > limit:
            raise HotrodError(f"--seq {seq}{' + --new-tokens ' + str(new_tokens) if kind == 'decoder' else ''} "
                              f"is longer than the model's {limit} positions")
    return [Case(f"b{b}-s{s}", str(src.path), kind, (s,) * b, new_tokens if kind != "encoder" else 0)
            for b in batches for s in seqs]


def missing_peers(peers: Sequence[str]) -> dict[str, str]:
    """Peers that cannot run here, with the reason (the run goes on without them)."""
    import importlib.util

    skipped = {}
    for peer in peers:
        if peer not in PEERS:
            raise HotrodError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
        module = _PEER_MODULES.get(peer)
        if module and importlib.util.find_spec(module.split(".")[0]) is None:
            skipped[peer] = f"not installed: no module {module} ({_INSTALL[peer]})"
        elif module:
            skipped[peer] = "installed, but hotrod's runner for it is not written yet"
    return skipped


def run(cases: Sequence[Case], precisions: Sequence[str], peers: Sequence[str], runs: int, threads: int,
        out: Path, progress: bool = True) -> list[Result]:
    """Time every case on every system; writes `out`/results.json after each case."""
    import hotrod

    if runs < 1:
        raise HotrodError("--runs must be >= 1")
    for precision in precisions:
        check_choice("precision", precision, PRECISIONS)
    skipped = missing_peers(peers)
    m = machine(threads)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    artifacts: dict[tuple[str, str], Path] = {}
    for case in cases:
        result = Result(case=asdict(case), skipped=dict(skipped))
        reference = pytorch_model(case.source, case.kind)
        ids, mask = case.inputs(reference.config.vocab_size)
        systems = {"pytorch": _pytorch(reference, case, ids, mask)}
        for precision in precisions:
            key = (case.source, precision)
            if key not in artifacts:
                artifacts[key] = _artifact(hotrod, case, precision, progress)
            model = hotrod.load(artifacts[key], threads=threads)
            systems[f"hotrod {precision}"] = _hotrod(model, case, ids, mask, artifacts[key])
        _time(case, systems, runs, mask, reference, m, result)
        results.append(result)
        write_json(results, m, out)
    return results


@dataclass
class _System:
    call: Callable[[], torch.Tensor]
    first_token: Callable[[], torch.Tensor] | None
    precision: str
    size_bytes: int | None
    rss_bytes: int


def _pytorch(model, case: Case, ids, mask) -> _System:
    first = pytorch_runner(model, case.kind, ids, mask, _one_token(case)) if case.kind != "encoder" else None
    return _System(pytorch_runner(model, case.kind, ids, mask, case.generate_kwargs()), first, "fp32",
                   _dir_size(Path(case.source)), _rss())


def _hotrod(model, case: Case, ids, mask, artifact: Path) -> _System:
    first = hotrod_runner(model, ids, mask, _one_token(case)) if case.kind != "encoder" else None
    return _System(hotrod_runner(model, ids, mask, case.generate_kwargs()), first,
                   model.manifest["options"]["precision"], _dir_size(artifact), _rss())


def _one_token(case: Case) -> dict:
    return {**case.generate_kwargs(), "max_new_tokens": 1, "min_new_tokens": 1}


def _artifact(hotrod, case: Case, precision: str, progress: bool) -> Path:
    import hashlib

    from hotrod.build import code_fingerprint

    tag = hashlib.sha256(f"{case.source}|{precision}|{code_fingerprint()}".encode()).hexdigest()[:16]
    path = cache_dir() / "bench" / "artifacts" / f"{Path(case.source).name}-{precision}-{tag}"
    if not (path / "manifest.json").is_file():
        hotrod.optimize(case.source, path, precision=precision, force=True, progress=progress, verify_examples=0)
    return path


def _time(case: Case, systems: dict[str, _System], runs: int, mask: torch.Tensor, reference, m: Machine,
          result: Result) -> None:
    outputs = {name: s.call() for name, s in systems.items()}  # the warm-up, and the answers compared
    times = interleaved({name: s.call for name, s in systems.items()}, runs=runs, warmup=0)
    first = ({name: s.first_token for name, s in systems.items()} if case.kind != "encoder" else {})
    first_times = interleaved(first, runs=runs) if first else {}
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
            "agreement": agreement(outputs[name], outputs["pytorch"], case.kind, mask),
            "size_bytes": system.size_bytes,
            "rss_bytes": system.rss_bytes,
        }
        if case.kind == "encoder":
            figures["sequences_per_s"] = case.batch / p50
        else:
            figures["tokens_per_s"] = case.batch * case.new_tokens / p50
            figures["first_token_s"] = statistics.median(first_times[name])
        result.systems[name] = figures


def _floor(case: Case, precision: str, step: int, total: int, m: Machine) -> float:
    tokens = sum(case.lengths)
    if case.kind == "encoder":
        return forward_floor(total, tokens, precision, m)
    # A batch reads the weights once per step for all its rows: the per-token traffic is shared.
    return generation_floor(step, total, tokens, case.new_tokens, precision, m)


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _dir_size(path: Path) -> int | None:
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _rss() -> int:
    """This process's resident memory now, in bytes (Linux), read after a system is loaded."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    import os

    return pages * os.sysconf("SC_PAGE_SIZE")


def write_json(results: Sequence[Result], m: Machine, out: Path) -> Path:
    path = out / "results.json"
    payload = {
        "machine": {**asdict(m), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
