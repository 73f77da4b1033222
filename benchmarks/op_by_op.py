"""hotrod's time per op type beside OpenVINO's on the same encoder work, and what a run right after a pause
costs each.

    python benchmarks/op_by_op.py ARTIFACT OPENVINO_XML [--batch N] [--length N] [--runs N] [--threads N]
                                  [--out DIR]

ARTIFACT is a hotrod CPU artifact of an encoder (the bench's, under hotrod's cache), OPENVINO_XML the
OpenVINO model of the same checkpoint (the bench's OpenVINO peer keeps its exports under hotrod's cache, one
folder per format). OpenVINO runs in the environment `HOTROD_OPENVINO_PYTHON` names (`make peers`), this
script run there as a worker; its per-node times come from its CPU plugin's own counters (PERF_COUNT),
hotrod's from onnxruntime's profiler (`hotrod profile`). Each system is also timed warm (runs back to back)
and as the bench times it (each run after an idle pause, `hotrod.timing.SETTLE_S`), in alternating blocks so
that a phase of the machine falls on both. Writes op_by_op.json and op_by_op.md into --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SETTLE_S = 0.3  # hotrod.timing.SETTLE_S, spelled out: the worker's environment has no hotrod
BLOCKS = 3  # alternating blocks of each system's warm and idle runs


def _median_ms(run: Callable[[], object], runs: int, pause: float) -> float:
    walls = []
    for _ in range(runs):
        if pause:
            time.sleep(pause)
        started = time.perf_counter()
        run()
        walls.append((time.perf_counter() - started) * 1e3)
    return statistics.median(walls)


def openvino_worker(xml: str, batch: int, length: int, runs: int, threads: int) -> None:
    """In OpenVINO's environment: one JSON line, its per-node-type milliseconds a run and its warm and idle
    medians for each block."""
    import numpy as np
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(xml, "CPU", {**config, "PERF_COUNT": "YES"})
    request = compiled.create_infer_request()
    ids = np.random.default_rng(0).integers(0, 1000, (batch, length))
    feeds = {}
    for port in compiled.inputs:
        name = port.get_any_name()
        feeds[name] = ids if "input_ids" in name else (np.zeros_like(ids) if "token_type" in name
                                                      else np.ones_like(ids))
    run = lambda: request.infer(feeds)  # noqa: E731
    for _ in range(3):
        run()
    ops: dict[str, float] = collections.defaultdict(float)
    nodes: collections.Counter = collections.Counter()
    for _ in range(runs):
        run()
        for info in request.get_profiling_info():
            if info.status == info.Status.EXECUTED:
                key = f"{info.node_type} ({info.exec_type})"
                ops[key] += info.real_time.total_seconds() * 1e3 / runs
                nodes[key] += 1
    plain = core.compile_model(xml, "CPU", config).create_infer_request()
    timed = lambda: plain.infer(feeds)  # noqa: E731
    timed()
    line = sys.stdin.readline  # the harness says when each block runs, so that the two alternate
    blocks = []
    while line().strip() == "block":
        blocks.append({"warm_ms": _median_ms(timed, runs, 0.0), "idle_ms": _median_ms(timed, runs, SETTLE_S)})
        print(json.dumps(blocks[-1]), flush=True)
    print(json.dumps({"ops": {k: {"ms": v, "nodes": nodes[k] // runs} for k, v in ops.items()}}), flush=True)


def hotrod_side(artifact: str, batch: int, length: int, runs: int, threads: int):
    import torch

    import hotrod
    from hotrod.bench.ops import profile_artifact, work_inputs

    profile = profile_artifact(artifact, batch=batch, length=length, runs=runs, threads=threads)
    _, ids = work_inputs(artifact, batch, length, 1, runs, "op_by_op times the CPU")
    model = hotrod.load(artifact, device="cpu", threads=threads)
    mask = torch.ones_like(ids)
    run = lambda: model(input_ids=ids, attention_mask=mask)  # noqa: E731
    run()
    return profile, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("openvino_xml")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--openvino-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (1 <= args.batch <= 64 and 1 <= args.length <= 512 and 1 <= args.runs <= 1000 and args.threads >= 1):
        parser.error("batch must be 1..64, length 1..512, runs 1..1000, threads at least 1")
    if args.openvino_worker:
        openvino_worker(args.openvino_xml, args.batch, args.length, args.runs, args.threads)
        return
    if args.out is None:
        parser.error("--out is needed")
    python = os.environ.get("HOTROD_OPENVINO_PYTHON")
    if not python:
        parser.error("HOTROD_OPENVINO_PYTHON must name OpenVINO's Python (make peers builds one)")
    profile, run = hotrod_side(args.artifact, args.batch, args.length, args.runs, args.threads)
    worker = subprocess.Popen([python, __file__, args.artifact, args.openvino_xml, "--batch", str(args.batch),
                               "--length", str(args.length), "--runs", str(args.runs), "--threads",
                               str(args.threads), "--openvino-worker"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    blocks = []
    for _ in range(BLOCKS):
        worker.stdin.write("block\n")
        worker.stdin.flush()
        openvino = json.loads(worker.stdout.readline())
        time.sleep(SETTLE_S)  # OpenVINO's threads may spin on after its last run
        blocks.append({"hotrod": {"warm_ms": _median_ms(run, args.runs, 0.0),
                                  "idle_ms": _median_ms(run, args.runs, SETTLE_S)}, "openvino": openvino})
    worker.stdin.write("done\n")
    worker.stdin.flush()
    openvino_ops = json.loads(worker.stdout.readline())["ops"]
    if worker.wait() != 0:
        sys.exit("op_by_op: OpenVINO's worker failed")
    graph = profile.graphs[0]
    # the folders' names, which say the workload and format, not where this machine keeps them
    result = {"artifact": Path(args.artifact).name, "openvino_model": Path(args.openvino_xml).parent.name,
              "batch": args.batch,
              "length": args.length, "runs": args.runs, "threads": args.threads, "blocks": blocks,
              "hotrod_ops": {o.op: {"ms": o.ms, "nodes": o.nodes} for o in graph.ops},
              "hotrod_kernels_ms": graph.kernels_ms, "openvino_ops": openvino_ops}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "op_by_op.json").write_text(json.dumps(result, indent=2))
    (args.out / "op_by_op.md").write_text(report(result))
    print(report(result))


def report(result: dict) -> str:
    lines = [f"# Op by op: batch {result['batch']} x {result['length']}, {result['threads']} threads, "
             f"{result['runs']} runs a median", "",
             "| block | hotrod warm ms | OpenVINO warm ms | warm ratio | hotrod after a pause ms | "
             "OpenVINO after a pause ms | ratio after a pause |", "|---|---|---|---|---|---|---|"]
    for i, block in enumerate(result["blocks"], 1):
        h, o = block["hotrod"], block["openvino"]
        lines.append(f"| {i} | {h['warm_ms']:.2f} | {o['warm_ms']:.2f} | {o['warm_ms'] / h['warm_ms']:.2f}x | "
                     f"{h['idle_ms']:.2f} | {o['idle_ms']:.2f} | {o['idle_ms'] / h['idle_ms']:.2f}x |")
    for name, ops in (("hotrod (onnxruntime's profiler)", result["hotrod_ops"]),
                      ("OpenVINO (PERF_COUNT)", result["openvino_ops"])):
        total = sum(o["ms"] for o in ops.values())
        lines += ["", f"## {name}: {total:.2f} ms of kernels a run", "", "| op | ms a run | nodes |",
                  "|---|---|---|"]
        for op, o in sorted(ops.items(), key=lambda item: -item[1]["ms"])[:12]:
            lines.append(f"| {op} | {o['ms']:.3f} | {o['nodes']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
