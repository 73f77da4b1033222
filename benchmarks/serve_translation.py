"""W10 served: the Marian OPUS-MT en-de shape behind `hotrod serve`, against CTranslate2 behind the batching
server its users write (`ct2_server.py`), under the same closed-loop load.

    python benchmarks/serve_translation.py [--precision int8] [--ct2-quantization int8] [--concurrency 16]
                                           [--requests 64] [--new-tokens 48] [--threads 2]
                                           [--systems hotrod,ctranslate2] [--batch-wait-ms 5]
                                           [--out benchmarks/results/serve-cpu-translation] [--tiny]

The W10 checkpoint (`hotrod.bench.workloads`: Marian's shape, seeded random weights) is the one `hotrod bench
--workload W10` times, built once under the hotrod cache; hotrod serves its artifact at `--precision` with
continuous batching, CTranslate2 its own conversion at `--ct2-quantization` (on the CPU its int8 is
int8_float32: `hotrod.bench.ct2`) behind `ct2_server.py`, a FastAPI app that gathers requests for a few
milliseconds and translates each batch in one `translate_batch` call. Each server is started alone on
loopback with `--threads` threads and warmed up (`--concurrency` requests at once, then one more); then
`--concurrency` clients each send their next request when their last is answered, until `--requests` are
done: the same seeded sources of 8..64 token ids for both, each asking for `--new-tokens` tokens, greedy,
through the same /v1/generate body. HTTP cannot
force a length, so a request may end at EOS on either server (random weights rarely emit it): throughput
counts the tokens returned. Reported: tokens/s, requests/s, p50 and p95 latency per server, and hotrod's
over CTranslate2's. Writes OUT.json and OUT.md. `--tiny`: a 2-layer, 32-wide Marian and 16 requests, to
check the script (its figures mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from serving import (
    GenRequest,
    Server,
    ServerFailed,
    UsageError,
    free_port,
    kill_server,
    machine_description,
    ms,
    percentile,
    run_cell,
    send,
    start_server,
    stop_server,
    wait_ready,
    write_results,
)

from hotrod.bench import ct2
from hotrod.bench.harness import cached_artifact
from hotrod.bench.workloads import WORKLOADS, checkpoint, marian_en_de_config
from hotrod.options import PRECISIONS
from hotrod.source import cache_dir

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "serve-cpu-translation"
SYSTEMS = ("hotrod", "ctranslate2")
SOURCE_TOKENS = (8, 64)  # W10's batch case's range, inclusive
SEED = 10
MAX_BATCH_SIZE = 32  # both servers' (serving.MAX_BATCH_SIZE for hotrod's)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of argparse's usage dump
        raise UsageError(message)


def _tiny_marian():
    from transformers import MarianConfig, MarianMTModel

    small = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 1001,
             "decoder_vocab_size": 1001, "pad_token_id": 1000, "decoder_start_token_id": 1000,
             "max_position_embeddings": 128}
    return MarianMTModel(MarianConfig(**{**marian_en_de_config().to_dict(), **small}))


def w10_checkpoint(tiny: bool) -> Path:
    """W10's checkpoint where `hotrod bench` keeps it (shared with its runs), or the tiny stand-in."""
    workload = WORKLOADS["W10"]
    if tiny:
        workload = dataclasses.replace(workload, id="W10-tiny", build=_tiny_marian)
    return checkpoint(workload, cache_dir() / "bench" / "checkpoints")


def make_requests(count: int, vocab_size: int, pad: int | None, new_tokens: int, seed: int) -> list[GenRequest]:
    """Seeded sources of 8..64 random ids (never the pad id, which no source holds), each asking for
    `new_tokens` tokens."""
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        ids = [rng.randrange(2, vocab_size) for _ in range(rng.randint(*SOURCE_TOKENS))]
        requests.append(GenRequest([i - 1 if i == pad else i for i in ids], new_tokens))
    return requests


def ct2_server(model_dir: Path, threads: int, wait_ms: float, log_dir: Path) -> Server:
    port = free_port()
    log_path = log_dir / "server-ctranslate2.log"
    command = [sys.executable, str(Path(__file__).with_name("ct2_server.py")), str(model_dir), "--port", str(port),
               "--threads", str(threads), "--max-batch-size", str(MAX_BATCH_SIZE), "--batch-wait-ms", f"{wait_ms:g}"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return Server("ctranslate2", port, process, log_path)


def measure(server: Server, model: str, requests: list[GenRequest], args: argparse.Namespace) -> dict:
    """The server's cell: ready, one warm-up request, then the closed-loop load; p95 added to its latencies."""
    try:
        ready_s = wait_ready(server, args.ready_timeout)
    except ServerFailed:
        kill_server(server)
        print(f"serve_translation: {server.policy}'s log tail:\n{server.log_tail()}", file=sys.stderr)
        raise
    with httpx.Client(trust_env=False) as client:
        about = client.get(f"{server.url}/ready").json()
    print(f"{server.policy}: ready in {ready_s:.1f} s on port {server.port}", flush=True)
    warmup = make_requests(args.concurrency + 1, args.vocab_size, args.pad, args.new_tokens, args.seed + 1)
    asyncio.run(_warm(server.url, model, warmup[1:], args.request_timeout))
    cell = asyncio.run(run_cell(server.url, model, server.policy, args.concurrency, requests, warmup[0],
                                args.time_limit, args.request_timeout + 60.0, stream=False))
    latencies = [o["latency_s"] for o in cell.outcomes if o["status"] == "ok"]
    cell.latency_s["p95"] = percentile(latencies, 95)
    exit_info = stop_server(server)
    print(f"  {cell.completed}/{cell.offered} completed, {cell.failed} failed, {cell.lost} lost, {cell.tokens} "
          f"tokens in {cell.wall_s:.1f} s = {cell.tokens_per_s:.1f} tokens/s, p50 {ms(cell.latency_s['p50'])} ms, "
          f"p95 {ms(cell.latency_s['p95'])} ms", flush=True)
    for error in cell.errors[:3]:
        print(f"    error: {error}", flush=True)
    return {**dataclasses.asdict(cell), "ready_s": round(ready_s, 3), "exit": exit_info,
            "compute_type": about.get("compute_type"), "log": str(server.log_path)}


async def _warm(url: str, model: str, requests: list[GenRequest], timeout: float) -> None:
    """A first batch as wide as the load's, untimed: each server allocates for its batch shapes here."""
    async with httpx.AsyncClient(trust_env=False, timeout=timeout) as client:
        await asyncio.gather(*(send(client, f"{url}/v1/generate", model, r, -1, stream=False) for r in requests))


def ratio(cells: list[dict]) -> dict | None:
    """hotrod's tokens/s over CTranslate2's, and CTranslate2's p50 and p95 over hotrod's."""
    mine = next((c for c in cells if c["policy"].startswith("hotrod") and c["completed"]), None)
    theirs = next((c for c in cells if c["policy"].startswith("ctranslate2") and c["completed"]), None)
    if mine is None or theirs is None or not theirs["tokens_per_s"]:
        return None
    return {"hotrod": mine["policy"], "against": theirs["policy"],
            "tokens_per_s": mine["tokens_per_s"] / theirs["tokens_per_s"],
            **{q: theirs["latency_s"][q] / mine["latency_s"][q] for q in ("p50", "p95")}}


def report(data: dict) -> str:
    s, m = data["settings"], data["machine"]
    lines = ["# W10 served: Marian en-de, `hotrod serve` against CTranslate2 behind a batching server "
             "(`python benchmarks/serve_translation.py`)", "",
             f"Machine: {m['cpu']}, {m['cpu_count']} CPUs, {s['threads']} threads a server; python {m['python']}, "
             f"torch {m['torch']}, onnxruntime {m['onnxruntime']}, hotrod {m['hotrod']}, ctranslate2 {s['ctranslate2']}.",
             f"Model: {s['model']}. {s['requests']} requests (the same seeded list for both), sources of "
             f"{SOURCE_TOKENS[0]}..{SOURCE_TOKENS[1]} token ids, {s['new_tokens']} new tokens asked, greedy; "
             f"{s['concurrency']} closed-loop clients after uncounted warm-up requests; max batch {MAX_BATCH_SIZE}; "
             f"CTranslate2's server gathers for {s['batch_wait_ms']:g} ms.", "",
             "| server | completed / failed / lost | tokens | wall s | tokens/s | req/s | p50 ms | p95 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for c in data["cells"]:
        lat = c["latency_s"]
        lines.append(f"| {c['policy']} | {c['completed']} / {c['failed']} / {c['lost']} | {c['tokens']} | "
                     f"{c['wall_s']:.1f} | {c['tokens_per_s']:.1f} | {c['requests_per_s']:.2f} | {ms(lat.get('p50'))} | "
                     f"{ms(lat.get('p95'))} |")
    r = data.get("ratio")
    if r:
        lines += ["", f"**{r['hotrod']} over {r['against']}: {r['tokens_per_s']:.2f}x the tokens/s, p50 "
                      f"{r['p50']:.2f}x and p95 {r['p95']:.2f}x lower.**"]
    lines += [f"\nNot measured: {problem}" for problem in data["problems"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="serve_translation", description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="int8", help="hotrod's precision")
    parser.add_argument("--ct2-quantization", default="int8", help=f"one of {', '.join(ct2.QUANTIZATIONS)}")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"a subset of {','.join(SYSTEMS)}")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--requests", type=int, default=None, help="requests per server (default 64; --tiny 16)")
    parser.add_argument("--new-tokens", type=int, default=WORKLOADS["W10"].new_tokens, help="max_new_tokens asked")
    parser.add_argument("--threads", type=int, default=2, help="each server's CPU threads")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long CTranslate2's server gathers")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds a server's load may run")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="hotrod's --request-timeout")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /ready")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the request list")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="writes OUT.json and OUT.md")
    parser.add_argument("--tiny", action="store_true", help="a tiny Marian and 16 requests (a check of the script)")
    args = parser.parse_args(argv)
    args.requests = args.requests if args.requests is not None else (16 if args.tiny else 64)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.systems or any(s not in SYSTEMS for s in args.systems):
        raise UsageError(f"--systems: {args.systems}; choose from {', '.join(SYSTEMS)}")
    if min(args.requests, args.concurrency, args.new_tokens, args.threads) < 1:
        raise UsageError("--requests, --concurrency, --new-tokens and --threads must be >= 1")
    if args.precision not in PRECISIONS:
        raise UsageError(f"--precision: unknown {args.precision!r}; choose from {', '.join(PRECISIONS)}")
    if args.ct2_quantization not in ct2.QUANTIZATIONS:
        raise UsageError(f"--ct2-quantization: unknown {args.ct2_quantization!r}; choose from "
                         f"{', '.join(ct2.QUANTIZATIONS)}")
    return args


def run(args: argparse.Namespace) -> dict:
    import ctranslate2
    from transformers import AutoConfig

    source = w10_checkpoint(args.tiny)
    config = AutoConfig.from_pretrained(source)
    args.vocab_size, args.pad = config.vocab_size, config.pad_token_id
    requests = make_requests(args.requests, args.vocab_size, args.pad, args.new_tokens, args.seed)
    model = (f"Marian en-de shape, d_model {config.d_model}, {config.encoder_layers} + {config.decoder_layers} "
             f"layers, vocabulary {config.vocab_size}")
    cells, problems = [], []
    log_dir = Path(tempfile.mkdtemp(prefix="serve_translation-"))
    server = None
    try:
        if "hotrod" in args.systems:
            artifact = cached_artifact(source, args.precision, progress=True)
            server = start_server(artifact, "continuous", args.threads, args.request_timeout, log_dir)
            server.policy = f"hotrod serve {args.precision}"
            cells.append(measure(server, artifact.name, requests, args))
        if "ctranslate2" in args.systems:
            converted = ct2.convert(str(source), ct2.QUANTIZATIONS[args.ct2_quantization])
            server = ct2_server(converted, args.threads, args.batch_wait_ms, log_dir)
            server.policy = f"ctranslate2 {args.ct2_quantization}"
            cells.append(measure(server, converted.name, requests, args))
        server = None
    finally:
        kill_server(server)
    for cell in cells:  # a server that failed requests keeps its log beside the results
        log = Path(cell.pop("log"))
        if cell["failed"] or cell["lost"] or not cell["exit"]["clean"]:
            saved = args.out.parent / f"{args.out.name}.{cell['policy'].split()[0]}.log"
            saved.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, saved)
            problems.append(f"{cell['policy']} had failures; its log: {saved}")
    shutil.rmtree(log_dir, ignore_errors=True)
    settings = {"model": model, "tiny": args.tiny, "precision": args.precision, "ct2_quantization":
                args.ct2_quantization, "ctranslate2": ctranslate2.__version__, "requests": args.requests,
                "concurrency": args.concurrency, "new_tokens": args.new_tokens, "threads": args.threads,
                "batch_wait_ms": args.batch_wait_ms, "max_batch_size": MAX_BATCH_SIZE, "seed": args.seed,
                "systems": args.systems}
    return {"workload": "W10 served", "machine": machine_description(args.threads), "settings": settings,
            "cells": cells, "ratio": ratio(cells), "problems": problems}


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        data = run(args)
    except UsageError as exc:
        print(f"serve_translation: error: {exc}", file=sys.stderr)
        return 2
    except ServerFailed as exc:
        print(f"serve_translation: error: {exc}", file=sys.stderr)
        return 1
    write_results(args.out, data, report(data))
    return 0 if all(c["failed"] == 0 and c["lost"] == 0 for c in data["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())
