"""W1-W4 side by side: hotrod on ONNX Runtime against transformers' PyTorch model, in one run.

The timing is `hotrod bench`'s harness (`hotrod.bench.harness`): the same seeded random checkpoint and
inputs for both systems, the same thread count, interleaved runs after a warm-up, medians compared as
ratios, each system's time as a multiple of the hardware floor. hotrod's fp32 answers are checked
against PyTorch's.

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
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from hotrod.artifact import MANIFEST
from hotrod.bench import harness
from hotrod.bench.floor import machine
from hotrod.bench.workloads import WORKLOADS, Workload
from hotrod.runtime.base import cpu_threads
from hotrod.source import cache_dir


def passing_precisions(workload: Workload, max_drop: float) -> tuple[list[str], str]:
    """Precisions that met the accuracy budget on the workload family's trained demo model."""
    from hotrod.demo.models import demo_model
    from hotrod.demo.run import demo_artifact

    artifact = demo_artifact(demo_model(workload.accuracy_model), cache_dir() / "demo", max_drop)
    rows = json.loads((artifact / MANIFEST).read_text())["auto"]["candidates"]
    return [r["precision"] for r in rows if r["status"] in ("kept", "passed")], workload.accuracy_model


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
        [result] = harness.run(harness.workload_cases([wid]), precisions, [], args.runs, threads,
                               cache_dir() / "bench" / "core")
        entry = {"workload": wid, "description": workload.description, **asdict(result)}
        if judged_on:
            timed = [p for p in precisions if f"hotrod {p}" in result.systems]  # a failed build is skipped
            fastest = min(timed, key=lambda p: result.systems[f"hotrod {p}"]["p50_s"])
            entry.update(auto=fastest, judged_on=judged_on, passing=precisions)
        results.append(entry)
        _print(entry)
    print(f"\n{platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, medians of {args.runs} interleaved runs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": threads, "machine": platform.uname()._asdict(),
                                         "floor_machine": asdict(m), "results": results}, indent=2))
    fp32_faithful = all(r["systems"].get("hotrod fp32", {}).get("agreement", 1.0) > 0.999 for r in results)
    return 0 if fp32_faithful else 1


def _print(entry: dict) -> None:
    encoder = entry["case"]["kind"] == "encoder"
    print(f"\n{entry['workload']}: {entry['description']}")
    if "auto" in entry:
        print(f"  auto: {entry['auto']} (fastest of {', '.join(entry['passing'])}, "
              f"which pass the budget on {entry['judged_on']})")
    measure = "hidden-state cosine" if encoder else "share of tokens equal"
    print(f"  {'system':<22}{'median s':>10}{'speedup':>9}{'x floor':>9}  {measure} with PyTorch")
    for name, figures in entry["systems"].items():
        precision = name.split()[-1]
        agree = f"{figures['agreement']:.4f}" if name != "pytorch" else ""
        mark = " <- auto" if entry.get("auto") == precision and name != "pytorch" else ""
        print(f"  {name:<22}{figures['p50_s']:>10.3f}{figures['speedup']:>8.2f}x{figures['times_floor']:>8.1f}x"
              f"  {agree}{mark}")


if __name__ == "__main__":
    sys.exit(main())
