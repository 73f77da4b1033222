"""W5: GPT-2 124M served by `hotrod serve`, under closed-loop load, for each batching policy.

The question is what batching buys a server: for each policy (continuous, request, none) one server is
started on loopback, and for each concurrency a fixed number of clients send the same seeded list of W5
requests (prompts of 8..128 random token ids, 16..128 new tokens, greedy), each sending its next request
when the previous one is answered. Every cell reports generated tokens per second, requests per second,
end-to-end latency percentiles and, with streaming, time to the first token. The same list in every cell
makes the cells comparable; the figure that matters is continuous over none at the highest concurrency.

Generation cannot be forced to its full length over HTTP, so a request may end early at EOS (random
weights rarely emit it); the tokens counted are the ones the server returned.

    python benchmarks/serve_load.py [--precision int8 | --artifact DIR] [--batching continuous,request,none]
                                    [--concurrency 1,8,32] [--requests 48] [--time-limit 120] [--threads 0]
                                    [--out benchmarks/results/serve-cpu] [--chaos | --ray]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from serving import (
    MAX_BATCH_SIZE,
    NEW_TOKENS,
    PROMPT_TOKENS,
    SEED,
    Cell,
    Server,
    ServerFailed,
    UsageError,
    build_artifact,
    key_line,
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

from hotrod.options import PRECISIONS
from hotrod.serve.scheduler import POLICIES

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "serve-cpu"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of argparse's usage dump
        raise UsageError(message)


def write_results(out: Path, report: dict[str, Any], cells: list[Cell], stream: bool) -> str:
    """`out`.json with every raw latency and `out`.md with the table; returns the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {**report, "cells": [asdict(c) for c in cells], "key": key_line(cells)}
    suffixed(out, ".json").write_text(json.dumps(report, indent=2) + "\n")
    m, s = report["machine"], report["settings"]
    shape = s["shape"]
    lines = [
        "# W5: GPT-2 served under closed-loop load (`python benchmarks/serve_load.py`)",
        "",
        f"Machine: {m['cpu']}, {m['cpu_count']} CPUs, server threads {s['threads'] or 'all'}; python {m['python']}, "
        f"torch {m['torch']}, onnxruntime {m['onnxruntime']}, hotrod {m['hotrod']}.",
        f"Model: {s['model_description']}, {s['precision']}. Each cell: {s['requests']} requests (the same seeded list in "
        f"every cell), prompts {shape['prompt'][0]}..{shape['prompt'][1]} random token ids, max_new_tokens "
        f"{shape['new'][0]}..{shape['new'][1]}, greedy; one uncounted warm-up request; closed-loop clients; "
        f"time limit {s['time_limit_s']:g} s per cell; server --max-batch-size {MAX_BATCH_SIZE}"
        + (", streamed (TTFT = first event with tokens)." if stream else "."),
        "tokens/s = generated tokens returned / wall time of the cell (the list asks for "
        f"{s['requested_tokens']} new tokens; fewer means early EOS or unfinished requests); latency is end to end "
        "per completed request; 'vs none' is tokens/s over that of policy none at the same concurrency.",
        "",
        table(cells, stream),
        "",
        f"**{key_line(cells)}**",
        "",
        "Server exits after SIGTERM: " + ", ".join(f"{p} {e['exit_code']}{'' if e['clean'] else ' (NOT clean)'}"
                                                   for p, e in report["servers"].items()),
    ]
    if any(c.hit_time_limit for c in cells):
        lines.append("Cells marked 'time limit' stopped issuing requests at the limit and report what completed.")
    text = "\n".join(lines) + "\n"
    suffixed(out, ".md").write_text(text)
    return text


# -- main -----------------------------------------------------------------------------------------------

def _list(text: str, option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{option} is empty")
    return items


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="serve_load", description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", type=Path, default=None, help="serve this artifact instead of building W5's")
    parser.add_argument("--precision", default="int8", help=f"precision of the W5 build: {', '.join(PRECISIONS)}")
    parser.add_argument("--batching", default=",".join(POLICIES), help="comma-separated policies to serve with")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--requests", type=int, default=48, help="requests per (policy, concurrency) cell")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per cell before no new request")
    parser.add_argument("--threads", type=int, default=0, help="the server's CPU threads (0: all cores)")
    parser.add_argument("--request-timeout", type=float, default=300.0,
                        help="the server's --request-timeout (long, so queueing alone never ends in 504)")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /ready")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="plain JSON responses (no time-to-first-token figure)")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the request list")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="writes OUT.json and OUT.md")
    parser.add_argument("--ray", action="store_true", help="continuous batching through Ray Serve (1 and 2 "
                        "replicas) beside plain `hotrod serve` (benchmarks/serve_ray.py); writes OUT-ray.json/.md")
    parser.add_argument("--chaos", action="store_true", help="one continuous server, W5 beside hostile requests "
                        "(benchmarks/serve_chaos.py); writes OUT-chaos.json and OUT-chaos.md")
    args = parser.parse_args(argv)
    if args.ray and args.chaos:
        raise UsageError("--ray and --chaos are separate runs; choose one")
    args.policies = _list(args.batching, "--batching")
    bad = [p for p in args.policies if p not in POLICIES]
    if bad:
        raise UsageError(f"--batching: unknown policy {bad[0]!r}; choose from {', '.join(POLICIES)}")
    try:
        args.concurrencies = [int(c) for c in _list(args.concurrency, "--concurrency")]
    except ValueError:
        raise UsageError(f"--concurrency expects comma-separated integers, got {args.concurrency!r}") from None
    if any(c < 1 for c in args.concurrencies):
        raise UsageError("--concurrency values must be >= 1")
    if args.requests < 1:
        raise UsageError(f"--requests must be >= 1, got {args.requests}")
    for name in ("time_limit", "request_timeout", "ready_timeout"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if args.threads < 0:
        raise UsageError(f"--threads must be >= 0, got {args.threads}")
    if args.precision not in PRECISIONS:
        raise UsageError(f"--precision: unknown {args.precision!r}; choose from {', '.join(PRECISIONS)}")
    if args.artifact is not None and not args.artifact.is_dir():
        raise UsageError(f"--artifact {args.artifact}: no such directory")
    return args


def run(args: argparse.Namespace) -> int:
    """Every policy's server in turn, every concurrency against it; results written after each server."""
    if args.chaos:
        from serve_chaos import run_chaos

        return run_chaos(args)
    if args.ray:
        from serve_ray import run_ray

        return run_ray(args)
    if args.artifact is not None:
        artifact = args.artifact.resolve()
        manifest = read_manifest(artifact)
        dims = manifest["dims"]
        description = (f"the artifact {artifact.name} ({manifest.get('model_type')}, {dims.get('num_layers')} "
                       f"layers, hidden {dims.get('hidden_size')}, vocabulary {dims.get('vocab_size')})")
    else:
        artifact = build_artifact(args.precision)
        manifest = read_manifest(artifact)
        description = "GPT-2 124M (`GPT2Config()`, W1's seeded random weights)"
    precision = manifest.get("options", {}).get("precision", "?")
    shape = shape_for(manifest["dims"])
    requests = make_requests(shape, args.requests, args.seed)
    [warmup] = make_requests(shape, 1, args.seed + 1)
    if (shape.prompt, shape.new) != (PROMPT_TOKENS, NEW_TOKENS):
        print(f"note: the model has {shape.max_positions} positions; prompts scaled to {shape.prompt}, "
              f"new tokens to {shape.new}", flush=True)
    model = artifact.name
    client_timeout = args.request_timeout + 60.0
    report: dict[str, Any] = {
        "workload": "W5",
        "machine": machine_description(args.threads),
        "settings": {"model": model, "model_description": description, "artifact_source": _origin(manifest),
                     "precision": precision, "policies": args.policies, "concurrency": args.concurrencies,
                     "requests": args.requests, "time_limit_s": args.time_limit, "threads": args.threads,
                     "max_batch_size": MAX_BATCH_SIZE, "request_timeout_s": args.request_timeout,
                     "client_timeout_s": client_timeout, "stream": args.stream, "seed": args.seed,
                     "shape": asdict(shape), "requested_tokens": sum(r.max_new_tokens for r in requests)},
        "servers": {},
    }
    cells: list[Cell] = []
    troubled: list[Path] = []
    log_dir = Path(tempfile.mkdtemp(prefix="serve_load-"))
    server: Server | None = None
    try:
        for policy in args.policies:
            server = start_server(artifact, policy, args.threads, args.request_timeout, log_dir)
            try:
                ready_s = wait_ready(server, args.ready_timeout)
            except ServerFailed:
                kill_server(server)
                print(f"serve_load: server log tail ({server.log_path.name}):\n{server.log_tail()}", file=sys.stderr)
                troubled.append(server.log_path)
                raise
            print(f"{policy}: server ready in {ready_s:.1f} s on port {server.port}", flush=True)
            mine = []
            for concurrency in args.concurrencies:
                cell = asyncio.run(run_cell(server.url, model, policy, concurrency, requests, warmup,
                                            args.time_limit, client_timeout, args.stream))
                mine.append(cell)
                print(f"  concurrency {concurrency:>3}: {cell.completed}/{cell.offered} completed, "
                      f"{cell.failed} failed, {cell.lost} lost, {cell.tokens} tokens in {cell.wall_s:.1f} s = "
                      f"{cell.tokens_per_s:.1f} tokens/s, p50 {ms(cell.latency_s['p50'])} ms, "
                      f"p99 {ms(cell.latency_s['p99'])} ms", flush=True)
                for error in cell.errors[:3]:
                    print(f"    error: {error}", flush=True)
            exit_info = stop_server(server)
            exit_info["ready_s"] = round(ready_s, 3)
            report["servers"][policy] = exit_info
            cells += mine
            if not exit_info["clean"] or any(c.failed or c.lost or c.errors for c in mine):
                troubled.append(server.log_path)
            server = None
            write_results(args.out, report, cells, args.stream)
    finally:
        kill_server(server)
        if troubled:
            saved = suffixed(args.out, ".server.log")
            saved.parent.mkdir(parents=True, exist_ok=True)
            with saved.open("w") as out:
                for path in troubled:
                    out.write(f"==== {path.name}\n")
                    out.write(path.read_text(errors="replace") if path.is_file() else "(no log)\n")
            print(f"server logs of the runs with failures: {saved}", file=sys.stderr)
        shutil.rmtree(log_dir, ignore_errors=True)
    print()
    print(write_results(args.out, report, cells, args.stream))
    print(f"results: {suffixed(args.out, '.json')}, {suffixed(args.out, '.md')}")
    return 0 if all(c.failed == 0 and c.lost == 0 for c in cells) else 1


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        return run(args)
    except UsageError as exc:
        print(f"serve_load: error: {exc}", file=sys.stderr)
        return 2
    except ServerFailed as exc:
        print(f"serve_load: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("serve_load: interrupted", file=sys.stderr)
        return 130


def _origin(manifest: dict) -> str | None:
    """The artifact's checkpoint, named from hotrod's cache where it lies there (no one machine's folders)."""
    from hotrod.bench.harness import portable_source

    origin = manifest.get("source", {}).get("origin")
    return portable_source(origin) if origin else origin


if __name__ == "__main__":
    sys.exit(main())
