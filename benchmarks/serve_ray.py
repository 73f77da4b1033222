"""W5 through Ray Serve (`python benchmarks/serve_load.py --ray`), beside plain `hotrod serve` on the same cores.

Three servers in turn, all continuous batching, all on this machine's cores: plain `hotrod serve`; Ray
Serve with one replica holding every core (what Ray's proxy and router cost: the overhead ratio); and
Ray Serve with two replicas of half the cores each (what splitting a machine into replicas costs or
gains). The same seeded W5 list runs at each concurrency against each. Ray's cluster is started here,
in a session of its own, and stopped afterwards (this cluster's processes only).

The figures give the arithmetic for N nodes: each node runs its own proxy and replicas, so a cluster of
N such nodes behind one load balancer serves about N x (plain tokens/s) x (Ray over plain).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from serving import (
    Cell,
    Server,
    ServerFailed,
    build_artifact,
    free_port,
    kill_server,
    machine_description,
    make_requests,
    ms,
    read_manifest,
    run_cell,
    shape_for,
    start_server,
    stop_server,
    suffixed,
    table,
    wait_ready,
)

BIN = Path(sys.executable).parent


def start_cluster(cpus: int, temp: str) -> tuple[str, int]:
    """A one-node Ray cluster with `cpus` CPUs; its processes share one process group, returned to stop it."""
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    start = subprocess.Popen([str(BIN / "ray"), "start", "--head", f"--port={port}", f"--num-cpus={cpus}",
                              "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True)
    output, _ = start.communicate(timeout=180)
    if start.returncode != 0:
        raise ServerFailed(f"ray start failed: {output.strip().splitlines()[-1] if output.strip() else '?'}")
    return f"127.0.0.1:{port}", start.pid


def stop_cluster(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_serving(server: Server, timeout: float) -> float:
    """Ready through the proxy, and every replica up (the command says so once Ray has them all)."""
    start = time.perf_counter()
    wait_ready(server, timeout)
    while "--ray" in server.process.args and "hotrod: serving" not in server.log_path.read_text(errors="replace"):
        if server.process.poll() is not None or time.perf_counter() - start > timeout:
            raise ServerFailed(f"the {server.policy} deployment did not start all its replicas")
        time.sleep(0.5)
    return time.perf_counter() - start


def setups(cpus: int, address: str) -> list[tuple[str, list[str]]]:
    """(name, extra flags of `hotrod serve`) for each server of the comparison."""
    half = max(1, cpus // 2)
    return [("plain", []),
            ("ray-1-replica", ["--ray", address, "--replicas", "1", "--num-cpus", str(cpus)]),
            ("ray-2-replicas", ["--ray", address, "--replicas", "2", "--num-cpus", str(half)])]


def run_ray(args) -> int:
    """The Ray cells of `serve_load.py --ray`; writes OUT-ray.json and OUT-ray.md."""
    artifact = args.artifact.resolve() if args.artifact is not None else build_artifact(args.precision)
    manifest = read_manifest(artifact)
    shape = shape_for(manifest["dims"])
    requests = make_requests(shape, args.requests, args.seed)
    [warmup] = make_requests(shape, 1, args.seed + 1)
    cpus = args.threads or os.cpu_count() or 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # so that `finally` stops Ray
    temp = tempfile.mkdtemp(prefix="hr-ray-")
    log_dir = Path(tempfile.mkdtemp(prefix="serve_ray-"))
    address, group = start_cluster(cpus, temp)
    cells: list[Cell] = []
    exits: dict[str, Any] = {}
    server: Server | None = None
    try:
        for name, extra in setups(cpus, address):
            threads = cpus if name == "plain" else 0  # a replica's threads follow its --num-cpus
            server = start_server(artifact, "continuous", threads, args.request_timeout, log_dir, extra=extra)
            server.policy = name
            ready_s = wait_serving(server, args.ready_timeout)
            print(f"{name}: ready in {ready_s:.1f} s", flush=True)
            for concurrency in args.concurrencies:
                cell = asyncio.run(run_cell(server.url, artifact.name, name, concurrency, requests, warmup,
                                            args.time_limit, args.request_timeout + 60, args.stream))
                cells.append(cell)
                print(f"  concurrency {concurrency:>3}: {cell.completed}/{cell.offered} completed, {cell.failed} "
                      f"failed, {cell.lost} lost, {cell.tokens_per_s:.1f} tokens/s, p50 "
                      f"{ms(cell.latency_s['p50'])} ms", flush=True)
            exits[name] = stop_server(server)
            server = None
    finally:
        kill_server(server)
        stop_cluster(group)
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)
    report = {"workload": "W5 through Ray Serve", "machine": machine_description(cpus),
              "settings": {"model": artifact.name, "precision": manifest.get("options", {}).get("precision"),
                           "requests": args.requests, "concurrency": args.concurrencies, "cpus": cpus,
                           "stream": args.stream, "seed": args.seed},
              "servers": exits, "ratios": ratios(cells)}
    print(write(args.out, report, cells, args.stream))
    return 0 if all(c.failed == 0 and c.lost == 0 for c in cells) else 1


def ratios(cells: list[Cell]) -> dict[str, dict[str, float]]:
    """tokens/s of each Ray setup over plain `hotrod serve`, per concurrency."""
    plain = {c.concurrency: c.tokens_per_s for c in cells if c.policy == "plain"}
    out: dict[str, dict[str, float]] = {}
    for c in cells:
        if c.policy != "plain" and plain.get(c.concurrency):
            out.setdefault(c.policy, {})[str(c.concurrency)] = round(c.tokens_per_s / plain[c.concurrency], 3)
    return out


def write(out: Path, report: dict[str, Any], cells: list[Cell], stream: bool) -> str:
    from dataclasses import asdict

    out = suffixed(out, "-ray")
    out.parent.mkdir(parents=True, exist_ok=True)
    suffixed(out, ".json").write_text(json.dumps({**report, "cells": [asdict(c) for c in cells]}, indent=2) + "\n")
    m, s = report["machine"], report["settings"]
    ratio_lines = [f"- {name}: " + ", ".join(f"{r:.2f}x plain at concurrency {c}" for c, r in by.items())
                   for name, by in report["ratios"].items()]
    text = "\n".join([
        "# W5 through Ray Serve (`python benchmarks/serve_load.py --ray`)", "",
        f"Machine: {m['cpu']}, {s['cpus']} CPUs for every setup; hotrod {m['hotrod']}. Model {s['model']} "
        f"({s['precision']}), {s['requests']} requests per cell, continuous batching. 'policy' is the setup: "
        "plain `hotrod serve`; Ray Serve with one replica of all the CPUs; two replicas of half each.", "",
        table(cells, stream, against="plain"), "", *ratio_lines, "",
        "Exits after SIGTERM: " + ", ".join(f"{n} {e['exit_code']}" for n, e in report["servers"].items()),
    ]) + "\n"
    suffixed(out, ".md").write_text(text)
    return text
