"""W1-W4 side by side: hotrod on ONNX Runtime against transformers' PyTorch model, in one run.

Both systems get the same seeded random checkpoint (speed does not depend on weight values), the same
inputs and the same thread count; runs are interleaved after a warm-up and medians compared as ratios.
hotrod's fp32 answers are checked against PyTorch's before any timing.

`--precisions auto` (the default) is hotrod's `--precision auto` split in its two halves: accuracy is
judged on the trained demo model of the workload's family (`hotrod demo`'s artifacts: a precision passes
if it stays within `--max-drop` there), and among the passing precisions the fastest on the workload
itself is hotrod's figure. Every timed precision is reported.

    python benchmarks/core.py [--workloads W1,W2,W3,W4] [--precisions auto|fp32,int8,...] [--runs 5]
                              [--threads N] [--max-drop 0.01] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
import transformers

import hotrod
from hotrod.artifact import MANIFEST, is_artifact
from hotrod.bench.floor import Machine, forward_floor, generation_floor, machine, matmul_params
from hotrod.bench.runners import agreement, hotrod_runner, pytorch_model, pytorch_runner
from hotrod.bench.timing import interleaved, median
from hotrod.bench.workloads import WORKLOADS, Workload, checkpoint
from hotrod.build import code_fingerprint
from hotrod.load import cache_dir
from hotrod.runtime.base import cpu_threads

KINDS = {"W1": "decoder", "W2": "seq2seq", "W3": "encoder", "W4": "encoder"}


def passing_precisions(workload: Workload, max_drop: float) -> tuple[list[str], str]:
    """Precisions that met the accuracy budget on the workload family's trained demo model."""
    from hotrod.demo import demo_artifact
    from hotrod.demo_models import demo_model

    artifact = demo_artifact(demo_model(workload.accuracy_model), cache_dir() / "demo", max_drop)
    rows = json.loads((artifact / MANIFEST).read_text())["auto"]["candidates"]
    return [r["precision"] for r in rows if r["status"] in ("kept", "passed")], workload.accuracy_model


def floors(workload: Workload, model, kind: str, precisions: list[str], m: Machine) -> dict[str, float]:
    """The hardware floor of the workload at each precision (PyTorch's is fp32's)."""
    step, total = matmul_params(model, kind)
    tokens = sum(workload.lengths)
    if kind == "encoder":
        found = {p: forward_floor(total, tokens, p, m) for p in ["fp32", *precisions]}
    else:
        found = {p: generation_floor(step, total, tokens, workload.new_tokens, p, m) for p in ["fp32", *precisions]}
    return {"pytorch": found["fp32"], **{f"hotrod {p}": found[p] for p in precisions}}


def run_workload(workload: Workload, precisions: list[str], runs: int, threads: int, cache: Path,
                 m: Machine) -> dict:
    kind = KINDS[workload.id]
    source = checkpoint(workload, cache / "checkpoints")
    ours = {}
    for precision in precisions:
        artifact = cache / "artifacts" / f"{workload.id}-{precision}"
        if not is_artifact(artifact) or _manifest(artifact).get("code") != code_fingerprint():
            hotrod.optimize(source, artifact, precision=precision, force=True, verify_examples=0)
        ours[precision] = hotrod.load(artifact, threads=threads)
    theirs = pytorch_model(source, kind)
    ids, mask = workload.inputs(theirs.config.vocab_size)
    kwargs = workload.generate_kwargs() if kind != "encoder" else None
    run_theirs = pytorch_runner(theirs, kind, ids, mask, kwargs)
    reference = run_theirs()
    agree = {p: agreement(hotrod_runner(m, ids, mask, kwargs)(), reference, kind, mask) for p, m in ours.items()}
    systems = {"pytorch": run_theirs, **{f"hotrod {p}": hotrod_runner(m, ids, mask, kwargs) for p, m in ours.items()}}
    times = interleaved(systems, runs=runs)
    base = median(times["pytorch"])
    floor = floors(workload, theirs, kind, precisions, m)
    return {
        "workload": workload.id,
        "floor_s": floor,
        "times_floor": {name: median(t) / floor[name] for name, t in times.items()},
        "description": workload.description,
        "agreement": agree,
        "agreement_measure": "hidden-state cosine" if kind == "encoder" else "share of tokens equal",
        "seconds": times,
        "median_s": {name: median(t) for name, t in times.items()},
        "speedup": {name: base / median(t) for name, t in times.items()},
    }


def _manifest(artifact: Path) -> dict:
    return json.loads((artifact / MANIFEST).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--precisions", default="auto", help="'auto', or a comma-separated list to time")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="threads for both systems (default: all cores)")
    parser.add_argument("--max-drop", type=float, default=0.01, help="accuracy budget of 'auto'")
    parser.add_argument("--json", type=Path, default=None, help="write every raw run here")
    args = parser.parse_args()
    threads = cpu_threads(args.threads)
    torch.set_num_threads(threads)
    cache = cache_dir() / "bench"
    m = machine(threads)
    print(f"machine: {m.cpu}, {threads} threads: {m.bandwidth_gbs:.1f} GB/s, {m.matmul_gflops:.0f} GFLOP/s fp32, "
          f"{m.int8_gops or 0:.0f} GOP/s int8 (measured {m.measured})")
    results = []
    for wid in (w.strip() for w in args.workloads.split(",")):
        workload = WORKLOADS[wid]
        if args.precisions == "auto":
            precisions, judged_on = passing_precisions(workload, args.max_drop)
        else:
            precisions, judged_on = [p.strip() for p in args.precisions.split(",")], None
        result = run_workload(workload, precisions, args.runs, threads, cache, m)
        if judged_on:
            fastest = min(precisions, key=lambda p: result["median_s"][f"hotrod {p}"])
            result.update(auto=fastest, judged_on=judged_on, passing=precisions)
        results.append(result)
        _print(result)
    print(f"\n{platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, medians of {args.runs} interleaved runs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": threads, "machine": platform.uname()._asdict(),
                                         "floor_machine": m.__dict__, "results": results}, indent=2))
    fp32_faithful = all(r["agreement"].get("fp32", 1.0) > 0.999 for r in results)
    return 0 if fp32_faithful else 1


def _print(result: dict) -> None:
    print(f"\n{result['workload']}: {result['description']}")
    if "auto" in result:
        print(f"  auto: {result['auto']} (fastest of {', '.join(result['passing'])}, "
              f"which pass the budget on {result['judged_on']})")
    print(f"  {'system':<22}{'median s':>10}{'speedup':>9}{'x floor':>9}  {result['agreement_measure']} with PyTorch")
    for name, seconds in result["median_s"].items():
        precision = name.split()[-1]
        agree = f"{result['agreement'][precision]:.4f}" if name != "pytorch" else ""
        mark = " <- auto" if result.get("auto") == precision and name != "pytorch" else ""
        print(f"  {name:<22}{seconds:>10.3f}{result['speedup'][name]:>8.2f}x{result['times_floor'][name]:>8.1f}x"
              f"  {agree}{mark}")


if __name__ == "__main__":
    sys.exit(main())
