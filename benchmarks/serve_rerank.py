"""W7 through the servers: one query and its 100 documents per request, `hotrod serve`'s /v1/rerank against
Infinity's own server (`infinity_emb v2`, its /rerank), and sentence-transformers' `CrossEncoder.predict`
in process (a lower bound for any server around it).

    python benchmarks/serve_rerank.py [--precision int8-static] [--concurrency 1,4] [--requests 24]
                                      [--threads 2] [--out FILE]

The W7 checkpoint (seeded random MiniLM-L6-shaped cross-encoder, with the bench's word tokenizer) is built
once under the hotrod cache, with the hotrod artifact at `--precision`. Each server is started alone on
loopback with `--threads` threads and warmed up; then, per concurrency, that many closed-loop clients send
the same request until `--requests` have completed. Requests per second and p50 / p90 latency per server
and concurrency; every response is checked for 100 scores. Infinity runs in the environment that
`HOTROD_INFINITY_PYTHON` names (`make peers`) with its torch engine, and is skipped with the reason where
that environment has no `infinity_emb` server. Writes FILE.json and FILE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).parent))

from serving import free_port, machine_description, write_results  # noqa: E402  (loopback ports, the machine line)

from hotrod.bench.harness import cached_artifact  # noqa: E402

DEFAULT_OUT = Path("benchmarks/results/serve-cpu-rerank")
READY_S = 300.0


def w7_texts() -> tuple[Path, str, list[str]]:
    """The W7 checkpoint and the bench's query and documents as text (the pairs every W7 system scores)."""
    from hotrod.bench.case import Case
    from hotrod.bench.vocab import texts
    from hotrod.bench.workloads import WORKLOADS, checkpoint
    from hotrod.source import cache_dir

    w = WORKLOADS["W7"]
    source = checkpoint(w, cache_dir() / "bench" / "checkpoints")
    case = Case("W7", str(source), "encoder", w.lengths, task=w.head, query=w.query)
    ids, mask = case.inputs(int(json.loads((source / "config.json").read_text())["vocab_size"]))
    query, documents = texts(ids, mask, w.query)
    return source, query, documents


class Server:
    """A server in a child process on loopback, its output in a file, and how to ask it to rerank."""

    def __init__(self, name: str, command: list[str], port: int, route: str, body: dict, log: Path,
                 env: dict | None = None):
        self.name, self.port, self.route, self.body, self.log = name, port, route, body, log
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            env={**os.environ, **(env or {})})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.route}"

    def wait(self, documents: int) -> float:
        """Seconds until a rerank answers with every document's score; the server's log tail if it dies."""
        start = time.perf_counter()
        with httpx.Client(trust_env=False, timeout=60.0) as client:
            while time.perf_counter() - start < READY_S:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.log.read_text(errors='replace')[-2000:]}")
                try:
                    if len(scores(client.post(self.url, json=self.body))) == documents:
                        return time.perf_counter() - start
                except (httpx.TransportError, ValueError, KeyError):
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer within {READY_S:.0f} s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def scores(response: httpx.Response) -> list[float]:
    """The scores of a Cohere-shaped rerank answer (hotrod's and Infinity's alike)."""
    response.raise_for_status()
    return [float(r["relevance_score"]) for r in response.json()["results"]]


async def closed_loop(server: Server, concurrency: int, requests: int, documents: int) -> dict:
    """`concurrency` clients, each sending its next request when its last one answered, `requests` in all."""
    latencies: list[float] = []
    failed = 0
    left = requests

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal left, failed
        while left > 0:
            left -= 1
            start = time.perf_counter()
            try:
                ok = len(scores(await http.post(server.url, json=server.body))) == documents
            except (httpx.HTTPError, ValueError, KeyError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                failed += 1

    start = time.perf_counter()
    async with httpx.AsyncClient(trust_env=False, timeout=600.0) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    wall = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"server": server.name, "concurrency": concurrency, "completed": len(latencies), "failed": failed,
            "wall_s": wall, "requests_per_s": len(latencies) / wall,
            "p50_s": statistics.median(ordered) if ordered else None,
            "p90_s": ordered[math.ceil(0.9 * len(ordered)) - 1] if ordered else None}  # nearest rank


def cross_encoder(source: Path, query: str, documents: list[str], threads: int, runs: int) -> dict:
    """CrossEncoder.predict over the request's pairs in this process: seconds a request (the median)."""
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(threads)
    model = CrossEncoder(str(source), device="cpu", activation_fn=torch.nn.Identity())
    pairs = [(query, document) for document in documents]
    model.predict(pairs, show_progress_bar=False)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model.predict(pairs, show_progress_bar=False)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"server": "crossencoder (in process)", "concurrency": 1, "completed": runs, "failed": 0,
            "wall_s": sum(times), "requests_per_s": 1 / median, "p50_s": median, "p90_s": sorted(times)[-1]}


def infinity_problem(python: str | None) -> str | None:
    if not python:
        return "HOTROD_INFINITY_PYTHON is not set (make peers builds .venv-infinity)"
    check = subprocess.run([python, "-c", "import infinity_emb.infinity_server"], capture_output=True, text=True)
    return None if check.returncode == 0 else "its environment has no infinity_emb server (infinity-emb[server])"


def servers(args, source: Path, artifact: Path, query: str, documents: list[str], logs: Path) -> list:
    """A function that starts each server: hotrod's, then Infinity's where its environment has one."""
    hotrod_body = {"model": artifact.name, "query": query, "documents": documents}
    port = free_port()
    starts = [lambda: Server(
        f"hotrod {args.precision}", [sys.executable, "-m", "hotrod.cli", "serve", str(artifact), "--host",
                                     "127.0.0.1", "--port", str(port), "--threads", str(args.threads),
                                     "--max-batch-inputs", str(max(len(documents), 128))],
        port, "/v1/rerank", hotrod_body, logs / "hotrod.log")]
    python = os.environ.get("HOTROD_INFINITY_PYTHON")
    problem = infinity_problem(python)
    if problem:
        print(f"infinity skipped: {problem}", flush=True)
        return starts
    inf_port = free_port()
    binary = str(Path(python).with_name("infinity_emb"))
    inf_body = {"model": source.name, "query": query, "documents": documents, "raw_scores": True}
    starts.append(lambda: Server(
        "infinity (torch engine)", [binary, "v2", "--model-id", str(source), "--served-model-name", source.name,
                                    "--engine", "torch", "--device", "cpu", "--no-bettertransformer",
                                    "--host", "127.0.0.1", "--port", str(inf_port), "--log-level", "warning"],
        inf_port, "/rerank", inf_body, logs / "infinity.log",
        env={"OMP_NUM_THREADS": str(args.threads), "INFINITY_ANONYMOUS_USAGE_STATS": "0"}))
    return starts


def run(args) -> dict:
    source, query, documents = w7_texts()
    artifact = cached_artifact(source, args.precision, progress=True)
    logs = Path(tempfile.mkdtemp(prefix="serve_rerank-"))
    cells = []
    problems = []
    for start in servers(args, source, artifact, query, documents, logs):
        server = start()
        try:
            print(f"{server.name}: ready in {server.wait(len(documents)):.1f} s", flush=True)
            for concurrency in args.concurrency:
                cell = asyncio.run(closed_loop(server, concurrency, args.requests, len(documents)))
                cells.append(cell)
                print(f"  concurrency {concurrency}: {cell['requests_per_s']:.2f} req/s, p50 {_s(cell['p50_s'])}, "
                      f"{cell['failed']} failed", flush=True)
        except RuntimeError as exc:  # a server that never answered: reported, the others' cells kept
            problems.append(f"{server.name}: {str(exc).splitlines()[0][:300]}")
            print(f"{server.name} skipped: {problems[-1]}", flush=True)
        finally:
            server.stop()
    cells.append(cross_encoder(source, query, documents, args.threads, max(3, args.requests // 4)))
    return {"workload": "W7 through the servers", "machine": machine_description(args.threads),
            "settings": {"precision": args.precision, "documents": len(documents), "requests": args.requests,
                         "concurrency": args.concurrency, "threads": args.threads,
                         "document_tokens": "32..128", "query_tokens": 12},
            "cells": cells, "problems": problems}


def report(data: dict) -> str:
    lines = ["# W7 through the servers (`python benchmarks/serve_rerank.py`)", "", f"Machine: {data['machine']}.",
             f"Settings: {json.dumps(data['settings'])}.", "",
             "| system | concurrency | completed / failed | req/s | p50 s | p90 s |", "|---|---|---|---|---|---|"]
    for c in data["cells"]:
        lines.append(f"| {c['server']} | {c['concurrency']} | {c['completed']} / {c['failed']} | "
                     f"{c['requests_per_s']:.2f} | {_s(c['p50_s'])} | {_s(c['p90_s'])} |")
    lines += [f"\nNot measured: {problem}" for problem in data.get("problems", [])]
    return "\n".join(lines) + "\n"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="int8-static")
    parser.add_argument("--concurrency", default="1,4", help="comma-separated numbers of closed-loop clients")
    parser.add_argument("--requests", type=int, default=24, help="requests per server and concurrency")
    parser.add_argument("--threads", type=int, default=2, help="each server's CPU threads")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--concurrency expects comma-separated integers, got {args.concurrency!r}")
    if not args.concurrency or min(args.concurrency) < 1:
        parser.error("--concurrency values must be >= 1")
    if args.requests < 1 or args.threads < 1:
        parser.error("--requests and --threads must be >= 1")
    from hotrod.precisions import get

    get(args.precision)  # an unknown precision is one line before any work
    data = run(args)
    write_results(args.out, data, report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
