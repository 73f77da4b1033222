"""Where an artifact's time goes, operator by operator, against the floor of each graph's runs.

`hotrod profile ARTIFACT` loads an artifact with onnxruntime's profiler on, runs its kind's work (a
greedy generation of a forced length, or one forward) on seeded token ids after a warm-up, and sums
the profiler's per-node kernel times per operator type, per run of each graph. Beside them stand two
floors for one run: its matrix weights over the rate the machine reads a working set of their size (what
bounds a decoding step, which reads every weight once) and its matrix work over the measured matrix rate
(what bounds an encoder). The work is also timed without the profiler (which costs time of its own at every node), with
the time inside onnxruntime's graph runs summed: the rest is the time outside onnxruntime (binding, the
decoding loop), per step.

onnxruntime's profiler is the well-kept tool for the per-node times; what it lacks is the floor and the
sum per operator, which is all this adds. A graph's figures are per run, averaged over the profiled
runs (a decoder graph's prompt among its steps).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from hotrod import artifact as art
from hotrod.bench.floor import machine
from hotrod.build.static_engine import is_engine
from hotrod.errors import HotrodError, check_number
from hotrod.files import write_whole
from hotrod.kinds import spec as kind_spec
from hotrod.registry import Dims
from hotrod.runtime.base import cpu_threads

# Operators that multiply an activation by a weight matrix, and the input that holds the weight.
MATRIX_OPS = {"MatMul": 1, "Gemm": 1, "MatMulInteger": 1, "DynamicQuantizeMatMul": 1, "MatMulIntegerToFloat": 1,
              "MatMulNBits": 1, "QLinearMatMul": 3, "QGemm": 3, "FusedMatMul": 1}
MAX_RUNS = 100
MAX_BATCH = 256  # rows of one run's work: beyond, its inputs alone fill the memory
MAX_TOKENS = 4096


@dataclass(frozen=True)
class OpTime:
    op: str
    ms: float  # kernel time per run of the graph, summed over the op's nodes
    nodes: int


@dataclass(frozen=True)
class GraphTimes:
    graph: str
    runs: int  # in the profiled runs of the work
    run_ms: float  # its mean run as onnxruntime timed it, the profiler's own cost included
    kernels_ms: float  # the kernels' time per run (a decoder's prompt and steps alike)
    ops: list[OpTime]
    weight_mb: float  # the matrix weights one run reads
    traffic_floor_ms: float  # those weights over the machine's read rate for their size (`Machine.read_gbs`)
    work_floor_ms: float  # the matrix work of one run over the matrix rate
    work_kernels_ms: float  # this graph's kernel time in one run of the work


@dataclass(frozen=True)
class Profile:
    work_ms: float  # the mean run of the whole work, wall clock, timed without the profiler
    runs_ms: float  # the time of one run of the work spent inside onnxruntime's graph runs, idem
    steps: int  # decoding steps a run (new tokens), 1 for a forward
    graphs: list[GraphTimes]

    @property
    def outside_ms(self) -> float:
        """A run's time outside onnxruntime's graph runs: binding, the decoding loop, Python."""
        return max(self.work_ms - self.runs_ms, 0.0)


def profile_artifact(path: str | Path, batch: int = 1, length: int = 32, new_tokens: int = 64, runs: int = 3,
                     threads: int = 0) -> Profile:
    """Profile `runs` runs of the artifact's work on a batch of `batch` x `length` seeded token ids.

    The work is timed twice, each time after a warm-up: once without the profiler, for the wall clock
    (recording every node costs time of its own), once with it, for the kernels' times."""
    import hotrod

    artifact, ids = work_inputs(path, batch, length, new_tokens, runs, "profile times the CPU provider's kernels "
                                "against this machine's floor")
    manifest = artifact.manifest
    spec = kind_spec(manifest["kind"])
    plain = hotrod.load(artifact.path, device="cpu", threads=threads)
    time_work(plain, ids, spec.generates, new_tokens, 1)  # the warm-up
    plain.backend.run_ms = Counter()  # time inside onnxruntime's runs, from here on
    walls = time_work(plain, ids, spec.generates, new_tokens, runs)
    runs_ms = sum(plain.backend.run_ms.values()) / runs
    del plain
    model = hotrod.load(artifact.path, device="cpu", threads=threads, profile=True)
    time_work(model, ids, spec.generates, new_tokens, 1)  # the warm-up: its graph runs are skipped
    warm = dict(model.backend.profiled_runs)
    time_work(model, ids, spec.generates, new_tokens, runs)
    done = dict(model.backend.profiled_runs)
    events = model.backend.profile_events()
    floor = machine(cpu_threads(threads))
    rate = floor.rate(manifest["options"]["precision"])
    # The graph that reads the whole input, where the kind encodes it; every other run is a decoding step.
    encoder = next(iter(spec.contracts(Dims(**manifest["dims"])))) if spec.encodes else None
    times = []
    for name, entry in manifest["graphs"].items():
        summed = op_times(events.get(name, []), warm.get(name, 0), done.get(name, 0) - warm.get(name, 0))
        if summed is None:
            continue
        run_ms, durations, ops = summed
        weights, macs = matrix_weights(artifact.path / entry["file"])
        tokens = batch * length if name == encoder else batch  # a step's floor, where most runs are
        kernels = sum(o.ms for o in ops)
        times.append(GraphTimes(
            graph=name, runs=len(durations), run_ms=run_ms, kernels_ms=kernels, ops=ops, weight_mb=weights / 1e6,
            traffic_floor_ms=weights / (floor.read_gbs(weights) * 1e9) * 1e3, work_floor_ms=2 * macs * tokens / rate * 1e3,
            work_kernels_ms=kernels * len(durations) / runs))
    return Profile(work_ms=statistics.fmean(walls), runs_ms=runs_ms, steps=new_tokens if spec.generates else 1,
                   graphs=times)


def work_inputs(path: str | Path, batch: int, length: int, new_tokens: int, runs: int,
                what: str) -> tuple[art.Artifact, torch.Tensor]:
    """The CPU artifact at `path` and `batch` x `length` seeded token ids for its work, the figures checked;
    `what` says why another device's artifact is refused."""
    for name, value, high in (("batch", batch, MAX_BATCH), ("length", length, MAX_TOKENS),
                              ("new tokens", new_tokens, MAX_TOKENS), ("runs", runs, MAX_RUNS)):
        check_number(name, value, 1, high)
        if not isinstance(value, int):
            raise HotrodError(f"{name} must be a whole number, got {value!r}")
    artifact = art.open_artifact(path)
    manifest = artifact.manifest
    device = manifest["options"].get("device", "cpu")
    if device != "cpu":
        raise HotrodError(f"{what}; {artifact.path} was built for {device}")
    if is_engine(manifest):
        raise HotrodError(f"{what}; {artifact.path} is a torch engine artifact (--backend torch), which runs none "
                          "of onnxruntime's graphs")
    ids = torch.randint(0, manifest["dims"]["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(0))
    return artifact, ids


def time_work(model, ids: torch.Tensor, generates: bool, new_tokens: int, runs: int) -> list[float]:
    """Milliseconds of each of `runs` runs of the work: a greedy generation of `new_tokens`, or a forward."""
    mask = torch.ones_like(ids)

    def work() -> None:
        if generates:
            model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False)
        else:
            model(input_ids=ids, attention_mask=mask)

    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        walls.append((time.perf_counter() - started) * 1e3)
    return walls


def op_times(trace: list[dict], skip: int = 0, expected: int | None = None
             ) -> tuple[float, list[float], list[OpTime]] | None:
    """(mean run ms, each run's microseconds, kernel time per run by operator) from one session's profiler
    trace, leaving out its first `skip` runs and everything before the next; None where no run is left.
    `expected` is how many runs should be left: onnxruntime stops recording at a million events, and a
    trace cut short would misreport, so it is refused."""
    runs = sorted((e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])[skip:]
    if expected is not None and len(runs) < expected:
        raise HotrodError(f"onnxruntime's profiler recorded {len(runs)} of {expected} runs (it keeps at most a "
                          "million events): profile fewer runs or tokens")
    if not runs:
        return None
    since = runs[0]["ts"]
    total: dict[str, float] = defaultdict(float)
    nodes: dict[str, set[str]] = defaultdict(set)
    for event in trace:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time") or event["ts"] < since:
            continue
        op = event.get("args", {}).get("op_name", "?")
        total[op] += event["dur"]
        nodes[op].add(event["name"])
    durations = [e["dur"] for e in runs]
    ops = [OpTime(op, total[op] / len(runs) / 1e3, len(nodes[op])) for op in total]
    return statistics.fmean(durations) / 1e3, durations, sorted(ops, key=lambda o: -o.ms)


def matrix_weights(path: Path) -> tuple[int, int]:
    """(bytes, multiply-adds per token) of the weight matrices a graph's matrix ops read, each counted
    once; a quantized weight is read through its DequantizeLinear where the graph is in QDQ form."""
    model = onnx.load(str(path), load_external_data=False)  # sizes are in the headers; the data stays put
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    dequantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    seen: set[str] = set()
    size, macs = 0, 0
    for node in graph.node:
        position = MATRIX_OPS.get(node.op_type)
        if position is None or len(node.input) <= position:
            continue
        name = node.input[position]
        name = dequantized.get(name, name)
        tensor = initializers.get(name)
        if tensor is None or name in seen:
            continue  # a product of two activations (attention), or a weight counted already
        seen.add(name)
        size += _bytes(tensor) + sum(_bytes(initializers[i]) for i in node.input[position + 1:] if i in initializers)
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            macs += attrs["K"] * attrs["N"]
        else:
            macs += int(np.prod(tensor.dims))
    return size, macs


def _bytes(tensor: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims)) * itemsize


def format_profile(profile: Profile, top: int = 12) -> str:
    """The work's time and what of it onnxruntime's runs took, then a plain-text table per graph."""
    per_step = f" ({profile.outside_ms / profile.steps:.3f} ms a step over {profile.steps} steps)" \
        if profile.steps > 1 else ""
    lines = [f"work: {profile.work_ms:.3f} ms a run without the profiler; onnxruntime's graph runs "
             f"{profile.runs_ms:.3f} ms of it, outside them {profile.outside_ms:.3f} ms{per_step}",
             "(kernel times below are the profiler's, which costs a little time at every node of its own)"]
    for g in profile.graphs:
        floor = max(g.traffic_floor_ms, g.work_floor_ms)
        lines.append(f"{g.graph}: {g.runs} runs, kernels {g.kernels_ms:.3f} ms a run; floor {floor:.3f} ms "
                     f"({g.weight_mb:.1f} MB of matrix weights: {g.traffic_floor_ms:.3f} ms at the read rate; "
                     f"matrix work {g.work_floor_ms:.3f} ms at the matrix rate); kernels "
                     f"{g.kernels_ms / floor if floor else float('inf'):.1f}x floor")
        lines.append(f"  {'op':<34} {'ms a run':>9} {'nodes':>6} {'share':>6}")
        for o in g.ops[:top]:
            lines.append(f"  {o.op:<34} {o.ms:9.3f} {o.nodes:6d} {o.ms / g.kernels_ms:6.1%}")
        rest = g.ops[top:]
        if rest:
            lines.append(f"  {'(' + str(len(rest)) + ' more ops)':<34} {sum(o.ms for o in rest):9.3f}")
    return "\n".join(lines)


def check_output(path: Path) -> Path:
    """`path` where a file can be written: checked before a long profile, not after."""
    if path.is_dir():
        raise HotrodError(f"{path} is a directory; --json names the file to write")
    if not path.parent.is_dir():
        raise HotrodError(f"{path.parent} does not exist")
    return path


def write_profile(profile: Profile, path: Path) -> Path:
    """The figures as JSON at `path`, written whole or not at all (`hotrod.files.write_whole`)."""
    return write_whole(check_output(path), json.dumps({**asdict(profile), "outside_ms": profile.outside_ms}, indent=2))
