"""What the serving benchmarks share (`serve_load.py` and its `--chaos` and `--ray` runs, `serve_rerank.py`):
W5's seeded requests, its artifact, a `hotrod serve` child process on loopback, closed-loop load, and the
figures and table of a cell. Kept apart from any script's command line, so the scripts import it and never
one another.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

PROMPT_TOKENS = (8, 128)  # W5's ranges, inclusive
NEW_TOKENS = (16, 128)
MAX_BATCH_SIZE = 32
SEED = 5
STDERR_TAIL = 40  # lines of the server's log shown when it fails


class UsageError(Exception):
    """A bad option: one line and exit status 2."""


class ServerFailed(Exception):
    """The server did not become ready; its log tail says why. Exit status 1."""


# -- the requests ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """The request ranges actually used: W5's, scaled down only when the model has fewer positions."""

    prompt: tuple[int, int]
    new: tuple[int, int]
    vocab_size: int
    max_positions: int | None


@dataclass(frozen=True)
class GenRequest:
    prompt: list[int]
    max_new_tokens: int


def shape_for(dims: dict[str, Any]) -> Shape:
    """W5's ranges, shrunk in proportion for a model too short for them (a tiny test model, say).

    The server refuses a prompt plus max_new_tokens beyond the model's positions, so without this a small
    smoke-test model would fail every long request instead of exercising the path.
    """
    positions = dims.get("max_positions") or None
    prompt, new = PROMPT_TOKENS, NEW_TOKENS
    if positions is not None and prompt[1] + new[1] > positions:
        scale = positions / (prompt[1] + new[1])
        prompt = (max(1, int(prompt[0] * scale)), max(1, int(prompt[1] * scale)))
        new = (max(1, int(new[0] * scale)), max(1, int(new[1] * scale)))
    return Shape(prompt, new, int(dims["vocab_size"]), positions)


def make_requests(shape: Shape, count: int, seed: int = SEED) -> list[GenRequest]:
    """A seeded list of requests, so every cell (and every run) sends exactly the same work."""
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        length = rng.randint(*shape.prompt)
        prompt = [rng.randrange(shape.vocab_size) for _ in range(length)]
        requests.append(GenRequest(prompt, rng.randint(*shape.new)))
    return requests


# -- the artifact ---------------------------------------------------------------------------------------

def build_artifact(precision: str) -> Path:
    """The W5 model (W1's seeded GPT-2 124M checkpoint) optimized at `precision`, built once and cached where
    `hotrod bench` keeps its builds (`hotrod.bench.harness.cached_artifact`), so either reuses the other's."""
    from hotrod.bench.harness import cached_artifact
    from hotrod.bench.workloads import WORKLOADS, checkpoint
    from hotrod.source import cache_dir

    return cached_artifact(checkpoint(WORKLOADS["W1"], cache_dir() / "bench" / "checkpoints"), precision,
                           progress=True)


def read_manifest(artifact: Path) -> dict[str, Any]:
    """The artifact's manifest, refused early (exit 2) if it cannot serve generation."""
    manifest_path = artifact / "manifest.json"
    if not manifest_path.is_file():
        raise UsageError(f"--artifact {artifact}: not an artifact directory (no manifest.json)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("kind") != "decoder":
        raise UsageError(f"--artifact {artifact}: a {manifest.get('kind')} model; W5 needs a decoder (GPT-2)")
    return manifest


# -- the server -----------------------------------------------------------------------------------------

def write_results(out: Path, data: dict[str, Any], text: str) -> None:
    """OUT.json (the figures) and OUT.md (`text`, their report), and the report on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)


def free_port() -> int:
    """A loopback port nobody listens on now (the OS's pick), so parallel runs do not collide."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    policy: str
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = STDERR_TAIL) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_server(artifact: Path, policy: str, threads: int, request_timeout: float, log_dir: Path,
                 extra: list[str] | None = None) -> Server:
    """`hotrod serve` in a child process on loopback, its output kept in a file (a pipe could fill and stall it)."""
    port = free_port()
    log_path = log_dir / f"server-{policy}.log"
    command = [sys.executable, "-m", "hotrod.cli", "serve", str(artifact), "--host", "127.0.0.1",
               "--port", str(port), "--batching", policy, "--max-batch-size", str(MAX_BATCH_SIZE),
               "--threads", str(threads), "--request-timeout", f"{request_timeout:g}",
               "--max-new-tokens-limit", str(max(NEW_TOKENS[1], 256)), *(extra or [])]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return Server(policy, port, process, log_path)


def wait_ready(server: Server, timeout: float) -> float:
    """Seconds until GET /ready answers 200; ServerFailed if the process dies or the timeout passes."""
    start = time.perf_counter()
    with httpx.Client(trust_env=False, timeout=5.0) as client:
        while time.perf_counter() - start < timeout:
            if server.process.poll() is not None:
                raise ServerFailed(f"the {server.policy} server exited with status {server.process.returncode} "
                                   f"before it was ready")
            try:
                if client.get(f"{server.url}/ready").status_code == 200:
                    return time.perf_counter() - start
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.25)
    raise ServerFailed(f"the {server.policy} server was not ready within {timeout:g} s")


def stop_server(server: Server, timeout: float = 60.0) -> dict[str, Any]:
    """SIGTERM, then wait: a clean exit is status 0 or the signal's own (uvicorn re-raises SIGTERM)."""
    if server.process.poll() is not None:
        return {"exit_code": server.process.returncode, "clean": False, "note": "had already exited"}
    server.process.send_signal(signal.SIGTERM)
    start = time.perf_counter()
    try:
        code = server.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.process.kill()
        code = server.process.wait()
        return {"exit_code": code, "clean": False, "note": f"did not exit within {timeout:g} s of SIGTERM; killed"}
    return {"exit_code": code, "clean": code in (0, -signal.SIGTERM, 128 + signal.SIGTERM),
            "stop_s": round(time.perf_counter() - start, 3)}


def kill_server(server: Server | None) -> None:
    """Last resort in `finally`: never leave a server behind, whatever went wrong."""
    if server is not None and server.process.poll() is None:
        server.process.kill()
        server.process.wait()


# -- the load -------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    index: int
    status: str  # ok | failed | lost
    latency_s: float
    tokens: int = 0
    ttft_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None


async def send(client: httpx.AsyncClient, url: str, model: str, request: GenRequest, index: int,
               stream: bool) -> Outcome:
    """One request, timed end to end; an unanswered one is 'lost', any other error 'failed'."""
    body = {"model": model, "token_ids": request.prompt, "max_new_tokens": request.max_new_tokens,
            "stream": stream}
    start = time.perf_counter()
    try:
        if stream:
            return await _send_streaming(client, url, body, index, start)
        response = await client.post(url, json=body)
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            return Outcome(index, "failed", elapsed, error=f"HTTP {response.status_code}: {response.text[:200]}")
        data = response.json()
        return Outcome(index, "ok", elapsed, int(data["usage"]["completion_tokens"]),
                       finish_reason=data.get("finish_reason"))
    except httpx.TimeoutException as exc:
        return Outcome(index, "lost", time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a broken connection or a malformed answer counts against the server
        return Outcome(index, "failed", time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")


async def _send_streaming(client: httpx.AsyncClient, url: str, body: dict[str, Any], index: int,
                          start: float) -> Outcome:
    """The same request as server-sent events: the first event with tokens marks the time to first token."""
    ttft = None
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            return Outcome(index, "failed", time.perf_counter() - start,
                           error=f"HTTP {response.status_code}: {text[:200]}")
        final: dict[str, Any] | None = None
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                return Outcome(index, "failed", time.perf_counter() - start, ttft_s=ttft,
                               error=f"stream error: {event['error'].get('message')}")
            if ttft is None and event.get("token_ids"):
                ttft = time.perf_counter() - start
            if event.get("finish_reason") is not None:
                final = event
    elapsed = time.perf_counter() - start
    if final is None or "usage" not in final:
        return Outcome(index, "failed", elapsed, ttft_s=ttft, error="the stream ended without a final event")
    return Outcome(index, "ok", elapsed, int(final["usage"]["completion_tokens"]), ttft_s=ttft,
                   finish_reason=final.get("finish_reason"))


@dataclass
class Cell:
    policy: str
    concurrency: int
    offered: int
    started: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    requests_per_s: float = 0.0
    latency_s: dict[str, float | None] = field(default_factory=dict)
    ttft_p50_s: float | None = None
    hit_time_limit: bool = False
    errors: list[str] = field(default_factory=list)
    outcomes: list[dict[str, Any]] = field(default_factory=list)


async def run_cell(url: str, model: str, policy: str, concurrency: int, requests: list[GenRequest],
                   warmup: GenRequest, time_limit: float, client_timeout: float, stream: bool) -> Cell:
    """`concurrency` closed-loop clients work through `requests` until done or `time_limit` passes.

    After the limit no client starts another request, but the ones in flight are waited for, so a slow
    policy is reported by how much it completed rather than by a truncated cell.
    """
    cell = Cell(policy, concurrency, len(requests))
    limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
    timeout = httpx.Timeout(client_timeout, connect=30.0)
    endpoint = f"{url}/v1/generate"
    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=timeout) as client:
        warm = await send(client, endpoint, model, warmup, -1, stream)
        if warm.status != "ok":
            cell.errors.append(f"warm-up request {warm.status}: {warm.error}")
        next_index = 0
        outcomes: list[Outcome] = []
        start = time.perf_counter()
        deadline = start + time_limit

        async def client_loop() -> None:
            nonlocal next_index
            while next_index < len(requests) and time.perf_counter() < deadline:
                index = next_index
                next_index += 1
                outcomes.append(await send(client, endpoint, model, requests[index], index, stream))

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    summarize(cell, outcomes, wall, hit_limit=next_index < len(requests))
    return cell


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(cell: Cell, outcomes: list[Outcome], wall: float, hit_limit: bool) -> None:
    """A cell's figures from its raw outcomes; latencies are of completed requests only."""
    ok = [o for o in outcomes if o.status == "ok"]
    cell.started = len(outcomes)
    cell.completed = len(ok)
    cell.failed = sum(o.status == "failed" for o in outcomes)
    cell.lost = sum(o.status == "lost" for o in outcomes)
    cell.tokens = sum(o.tokens for o in ok)
    cell.wall_s = wall
    cell.tokens_per_s = cell.tokens / wall if wall > 0 else 0.0
    cell.requests_per_s = cell.completed / wall if wall > 0 else 0.0
    latencies = [o.latency_s for o in ok]
    cell.latency_s = {f"p{q}": percentile(latencies, q) for q in (50, 90, 99)}
    cell.latency_s["mean"] = sum(latencies) / len(latencies) if latencies else None
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    cell.ttft_p50_s = percentile(ttfts, 50)
    cell.hit_time_limit = hit_limit
    cell.errors += sorted({o.error for o in outcomes if o.error})[:10]
    cell.outcomes = [asdict(o) for o in sorted(outcomes, key=lambda o: o.index)]


# -- reporting ------------------------------------------------------------------------------------------

def machine_description(threads: int) -> dict[str, Any]:
    """What the figures depend on: the CPU, the core count and the versions of the runtime stack."""
    import onnxruntime
    import torch

    from hotrod.version import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:  # Linux names the CPU model here; platform does not
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(), "threads": threads,
            "python": platform.python_version(), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "hotrod": __version__}


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _ratio(cells: list[Cell], policy: str, concurrency: int, against: str = "none") -> float | None:
    """tokens/s of `policy` over tokens/s of `against` ('none' unless said), at the same concurrency."""
    mine = next((c for c in cells if c.policy == policy and c.concurrency == concurrency), None)
    base = next((c for c in cells if c.policy == against and c.concurrency == concurrency), None)
    if mine is None or base is None or not base.tokens_per_s:
        return None
    return mine.tokens_per_s / base.tokens_per_s


def key_line(cells: list[Cell]) -> str:
    """The headline: continuous over none at the highest concurrency measured."""
    top = max(c.concurrency for c in cells)
    ratio = _ratio(cells, "continuous", top)
    if ratio is None:
        return f"continuous vs none at concurrency {top}: not measured (both policies are needed)"
    cont = next(c for c in cells if c.policy == "continuous" and c.concurrency == top)
    none = next(c for c in cells if c.policy == "none" and c.concurrency == top)
    return (f"continuous @ {top}: {cont.tokens_per_s:.1f} tokens/s vs none @ {top}: {none.tokens_per_s:.1f} "
            f"tokens/s -> {ratio:.2f}x")


def table(cells: list[Cell], stream: bool, against: str = "none") -> str:
    """The markdown table, one row per (policy, concurrency), tokens/s also as a ratio to policy `against`."""
    head = f"| policy | concurrency | completed / failed / lost | tokens | wall s | tokens/s | vs {against} | req/s "
    head += "| p50 ms | p90 ms | p99 ms |" + (" TTFT p50 ms |" if stream else "")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in cells:
        ratio = _ratio(cells, c.policy, c.concurrency, against)
        note = f" (of {c.offered}, time limit)" if c.hit_time_limit else ""
        rows.append(f"| {c.policy} | {c.concurrency} | {c.completed} / {c.failed} / {c.lost}{note} | {c.tokens} "
                    f"| {c.wall_s:.1f} | {c.tokens_per_s:.1f} | {'-' if ratio is None else f'{ratio:.2f}x'} "
                    f"| {c.requests_per_s:.2f} | {ms(c.latency_s.get('p50'))} | {ms(c.latency_s.get('p90'))} "
                    f"| {ms(c.latency_s.get('p99'))} |" + (f" {ms(c.ttft_p50_s)} |" if stream else ""))
    return "\n".join(rows)


def suffixed(out: Path, suffix: str) -> Path:
    """OUT plus a suffix; not Path.with_suffix, which would eat a dot already in the name."""
    return out.parent / (out.name + suffix)
