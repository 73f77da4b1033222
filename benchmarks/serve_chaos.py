"""W5 with hostile traffic mixed in (`python benchmarks/serve_load.py --chaos`).

One continuous-batching server with an API key serves W5's GPT-2. First every good request (W5's seeded
list, greedy, streamed) runs alone, one at a time, to record the tokens it gets alone. Then the same good
requests run again under closed-loop load, while other clients send the hostile requests of issue 13
(oversized bodies and texts, non-JSON bodies, a missing key, uncomputable sampling parameters, ids outside
any vocabulary, too many stop strings or choices, malformed JSON, NaN) and clients that drop a beam
request mid-way. It passes when every good request gets exactly its tokens alone, every hostile one a 4xx,
nothing a 5xx, and the server's memory stays bounded (its peak resident size is reported beside its
size after warm-up).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from serving import (
    GenRequest,
    Server,
    build_artifact,
    kill_server,
    machine_description,
    make_requests,
    read_manifest,
    shape_for,
    start_server,
    stop_server,
    wait_ready,
)

KEY = "chaos-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Hostile:
    name: str
    body: bytes
    headers: dict[str, str]


def hostile_requests(model: str, vocab_size: int) -> list[Hostile]:
    """One of each kind of request the server must refuse with a 4xx, before any work."""
    def body(**fields: Any) -> bytes:
        return json.dumps({"model": model, **fields}).encode()

    words = " ".join(["word"] * 60_000)
    return [
        Hostile("60k-word text", body(text=words), {**AUTH, **JSON}),
        Hostile("5 MB body", b'{"text": "' + b"a" * (5 * 2**20) + b'"}', {**AUTH, **JSON}),
        Hostile("text/plain body", body(text="hi"), {**AUTH, "content-type": "text/plain"}),
        Hostile("form body", body(text="hi"), {**AUTH, "content-type": "application/x-www-form-urlencoded"}),
        Hostile("no API key", body(text="hi"), JSON),
        Hostile("wrong API key", body(text="hi"), {"Authorization": "Bearer nope", **JSON}),
        Hostile("temperature 1e-300", body(token_ids=[5, 6], do_sample=True, temperature=1e-300), {**AUTH, **JSON}),
        Hostile("temperature NaN", body(token_ids=[5, 6], do_sample=True).replace(b"}", b', "temperature": NaN}'),
                {**AUTH, **JSON}),
        Hostile("id beyond int64", body(token_ids=[1, 99999999999999999999]), {**AUTH, **JSON}),
        Hostile("id outside the vocabulary", body(token_ids=[1, vocab_size]), {**AUTH, **JSON}),
        Hostile("malformed JSON", b'{"text": "a",', {**AUTH, **JSON}),
        Hostile("20k prompt tokens", body(token_ids=[1] * 20_000), {**AUTH, **JSON}),
        Hostile("max_new_tokens 10**6", body(token_ids=[1, 2], max_new_tokens=10**6), {**AUTH, **JSON}),
    ]


COMPLETIONS_HOSTILE = [("five stop strings", {"prompt": "hi", "stop": list("abcde")}),
                       ("n 1000", {"prompt": "hi", "n": 1000}),
                       ("logprobs 50", {"prompt": "hi", "logprobs": 50})]


@dataclass
class Report:
    good: int = 0
    good_same_tokens: int = 0
    good_failures: list[str] = field(default_factory=list)
    hostile_statuses: dict[str, int] = field(default_factory=dict)
    hostile_not_4xx: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    abandoned_beams: int = 0
    rss_after_warmup_mb: float = 0.0
    rss_peak_mb: float = 0.0
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        five = sum(n for s, n in self.statuses.items() if s.startswith("5"))
        return self.good == self.good_same_tokens and not self.hostile_not_4xx and five == 0


async def generate(client: httpx.AsyncClient, url: str, model: str, request: GenRequest) -> tuple[int, list[int]]:
    """One good request, streamed; its status and the tokens it got."""
    body = {"model": model, "token_ids": request.prompt, "max_new_tokens": request.max_new_tokens, "stream": True}
    tokens: list[int] = []
    async with client.stream("POST", f"{url}/v1/generate", json=body, headers=AUTH) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, tokens
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    return 500, tokens
                tokens += event["token_ids"]
    return 200, tokens


async def hostile(client: httpx.AsyncClient, url: str, attack: Hostile) -> int:
    try:
        return (await client.post(f"{url}/v1/generate", content=attack.body, headers=attack.headers)).status_code
    except httpx.TransportError:  # counted against the server: every refusal must reach the client
        return 0


async def abandon_beam(client: httpx.AsyncClient, url: str, model: str) -> None:
    """A client that asks for a long beam search and leaves after a moment."""
    body = {"model": model, "token_ids": [5, 6, 7], "max_new_tokens": 64, "num_beams": 4}
    try:
        await client.post(f"{url}/v1/generate", json=body, headers=AUTH, timeout=0.5)
    except httpx.TimeoutException:
        pass


def rss_mb(pid: int) -> float:
    """The process's resident set size, from /proc (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def run_chaos_load(server: Server, model: str, requests: list[GenRequest], alone: list[list[int]],
                         attacks: list[Hostile], concurrency: int, report: Report) -> None:
    statuses: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=4 * concurrency + 8)
    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=httpx.Timeout(600.0)) as client:
        pending = list(enumerate(requests))
        peak = [rss_mb(server.process.pid)]

        async def good_client() -> None:
            while pending:
                index, request = pending.pop(0)
                status, tokens = await generate(client, server.url, model, request)
                statuses[str(status)] += 1
                report.good += 1
                if status == 200 and tokens == alone[index]:
                    report.good_same_tokens += 1
                else:
                    report.good_failures.append(f"request {index}: HTTP {status}, {len(tokens)} tokens")

        async def hostile_client() -> None:
            rounds = 0
            while pending or rounds == 0:
                for attack in attacks:
                    status = await hostile(client, server.url, attack)
                    statuses[str(status)] += 1
                    report.hostile_statuses[attack.name] = status
                    if not 400 <= status < 500:
                        report.hostile_not_4xx.append(f"{attack.name}: {status}")
                for name, fields in COMPLETIONS_HOSTILE:
                    response = await client.post(f"{server.url}/v1/completions", json={"model": model, **fields},
                                                 headers=AUTH)
                    statuses[str(response.status_code)] += 1
                    report.hostile_statuses[name] = response.status_code
                    if not 400 <= response.status_code < 500:
                        report.hostile_not_4xx.append(f"{name}: {response.status_code}")
                await abandon_beam(client, server.url, model)
                report.abandoned_beams += 1
                peak.append(rss_mb(server.process.pid))
                rounds += 1

        start = time.perf_counter()
        await asyncio.gather(*(good_client() for _ in range(concurrency)), hostile_client(), hostile_client())
        report.wall_s = time.perf_counter() - start
        report.rss_peak_mb = max(peak + [rss_mb(server.process.pid)])
    report.statuses = dict(statuses)


async def tokens_alone(server: Server, model: str, requests: list[GenRequest]) -> list[list[int]]:
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(600.0)) as client:
        return [(await generate(client, server.url, model, r))[1] for r in requests]


def run_chaos(args) -> int:
    """The chaos cell of `serve_load.py --chaos`; writes OUT-chaos.json and OUT-chaos.md."""
    artifact = args.artifact.resolve() if args.artifact is not None else build_artifact(args.precision)
    manifest = read_manifest(artifact)
    shape = shape_for(manifest["dims"])
    requests = make_requests(shape, args.requests, args.seed)
    model = artifact.name
    attacks = hostile_requests(model, shape.vocab_size)
    log_dir = Path(tempfile.mkdtemp(prefix="serve_chaos-"))
    server = start_server(artifact, "continuous", args.threads, args.request_timeout, log_dir,
                          extra=["--api-key", KEY])
    report = Report()
    try:
        wait_ready(server, args.ready_timeout)
        alone = asyncio.run(tokens_alone(server, model, requests))
        report.rss_after_warmup_mb = rss_mb(server.process.pid)
        concurrency = max(args.concurrencies)
        asyncio.run(run_chaos_load(server, model, requests, alone, attacks, concurrency, report))
        exit_info = stop_server(server)
    finally:
        kill_server(server)
        shutil.rmtree(log_dir, ignore_errors=True)
    write_chaos(Path(str(args.out) + "-chaos"), report, exit_info, args, manifest, concurrency)
    return 0 if report.passed and exit_info["clean"] else 1


def write_chaos(out: Path, report: Report, exit_info: dict[str, Any], args, manifest: dict, concurrency: int) -> None:
    model = "W5's GPT-2 124M" if args.artifact is None else f"the artifact {Path(args.artifact).name}"
    data = {"workload": "W5 + hostile", "machine": machine_description(args.threads), "passed": report.passed,
            "model": model,
            "precision": manifest.get("options", {}).get("precision"), "concurrency": concurrency,
            "server_exit": exit_info, **asdict(report)}
    out.with_name(out.name + ".json").write_text(json.dumps(data, indent=2) + "\n")
    m = data["machine"]
    lines = [
        "# W5 with hostile traffic (`python benchmarks/serve_load.py --chaos`)",
        "",
        f"Machine: {m['cpu']}, {m['cpu_count']} CPUs; torch {m['torch']}, onnxruntime {m['onnxruntime']}. "
        f"Model: {data['model']}, {data['precision']}; server `--batching continuous --api-key ...`.",
        f"{report.good} good requests (streamed, greedy) at concurrency {concurrency}, beside two clients sending "
        f"{len(report.hostile_statuses)} kinds of hostile request in a loop and dropping a beam request each round "
        f"({report.abandoned_beams} dropped).",
        "",
        f"- good requests with exactly the tokens they get alone: **{report.good_same_tokens} / {report.good}**",
        f"- hostile requests answered 4xx: **{'all' if not report.hostile_not_4xx else report.hostile_not_4xx}**",
        f"- responses by status: {dict(sorted(report.statuses.items()))}",
        f"- server memory: {report.rss_after_warmup_mb:.0f} MB after warm-up, {report.rss_peak_mb:.0f} MB at peak",
        f"- wall time {report.wall_s:.1f} s; server exit after SIGTERM: {exit_info['exit_code']}"
        + ("" if exit_info["clean"] else " (NOT clean)"),
        "",
        "| hostile request | status |",
        "|---|---|",
        *[f"| {name} | {status} |" for name, status in report.hostile_statuses.items()],
        "",
        f"**{'PASS' if report.passed else 'FAIL'}**",
    ]
    out.with_name(out.name + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
