"""CTranslate2 behind a small batching HTTP server: the peer `hotrod serve` is measured against in W10's served
run (`serve_translation.py`).

CTranslate2 has no server of its own: it is a library, and its users deploy it inside a web app they write.
This is that app in the shape they write it (and the shape CTranslate2's documentation points to for
throughput: batch the requests, then call `translate_batch` once for the batch): a FastAPI app whose handler
puts each request on a queue and waits; one batching task takes the first waiting request, gathers those that
arrive within a few milliseconds (`--batch-wait-ms`, up to `--max-batch-size`), and translates them together
with `Translator.translate_batch` in a worker thread, so the event loop keeps accepting requests meanwhile.
The batch runs to its end: CTranslate2 batches per call, not per step (no continuous batching), so a request
that arrives during a call waits for the next.

The route takes the fields of hotrod's /v1/generate that the benchmark sends (`token_ids`, `max_new_tokens`,
`num_beams`) and answers in its shape (`token_ids`, `finish_reason`, `usage`), so one client drives both
servers with the same requests; ids become the converted model's token strings and back (the workload
checkpoints have no tokenizer, and neither server tokenizes here). Decoding ends at EOS or at
`max_new_tokens`, as hotrod's server does (HTTP cannot force a length on either).

    python benchmarks/ct2_server.py MODEL_DIR --port 8000 [--threads 2] [--max-batch-size 32] [--batch-wait-ms 5]

MODEL_DIR is a converted model (`hotrod.bench.ct2.convert`). GET /ready answers 200 once it is loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from hotrod.bench.ct2 import vocabulary

MAX_NEW_TOKENS = 256


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    token_ids: list[int] = Field(min_length=1)
    max_new_tokens: int = Field(32, ge=1, le=MAX_NEW_TOKENS)
    num_beams: int = Field(1, ge=1, le=8)
    stream: bool = False


@dataclass
class Pending:
    """One request waiting for its batch: its source as token strings and what it asks for."""

    tokens: list[str]
    max_new_tokens: int
    num_beams: int
    answer: asyncio.Future = field(repr=False)

    @property
    def settings(self) -> tuple[int, int]:
        return self.max_new_tokens, self.num_beams


class Batcher:
    """Gathers waiting requests into batches and translates each batch in one `translate_batch` call."""

    def __init__(self, translator, max_batch_size: int, wait_s: float):
        self.translator, self.max_batch_size, self.wait_s = translator, max_batch_size, wait_s
        self.queue: asyncio.Queue[Pending] = asyncio.Queue()
        self.batches = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + self.wait_s
            while len(batch) < self.max_batch_size and (left := deadline - loop.time()) > 0:
                if self.queue.empty():
                    await asyncio.sleep(min(left, 0.001))
                else:
                    batch.append(self.queue.get_nowait())
            for settings in dict.fromkeys(p.settings for p in batch):  # one call per kind of request
                group = [p for p in batch if p.settings == settings]
                try:
                    results = await loop.run_in_executor(None, self._translate, group)
                except Exception as exc:  # every request of the call fails with it; the server goes on
                    for pending in group:
                        if not pending.answer.done():
                            pending.answer.set_exception(exc)
                    continue
                for pending, tokens in zip(group, results, strict=True):
                    if not pending.answer.done():  # its client may have gone
                        pending.answer.set_result(tokens)
                self.batches += 1

    def _translate(self, group: list[Pending]) -> list[list[str]]:
        new_tokens, beams = group[0].settings
        results = self.translator.translate_batch([p.tokens for p in group], beam_size=beams,
                                                  max_decoding_length=new_tokens, return_scores=False)
        return [r.hypotheses[0] for r in results]


def create_app(model_dir: Path, threads: int, max_batch_size: int, wait_s: float) -> FastAPI:
    import ctranslate2

    tokens = vocabulary(model_dir)
    index = {token: i for i, token in enumerate(tokens)}
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=threads, inter_threads=1)
        state["batcher"] = batcher = Batcher(translator, max_batch_size, wait_s)
        state["compute_type"] = translator.compute_type
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()

    app = FastAPI(title="CTranslate2 batching server", lifespan=lifespan)

    @app.get("/ready")
    async def ready() -> dict:
        return {"status": "ready", "compute_type": state["compute_type"]}

    @app.post("/v1/generate")
    async def generate(body: GenerateBody) -> dict:
        if body.stream:
            raise HTTPException(400, "this server answers whole translations only (stream: false)")
        if any(not 0 <= i < len(tokens) for i in body.token_ids):
            raise HTTPException(400, f"token ids must lie in 0..{len(tokens) - 1}")
        pending = Pending([tokens[i] for i in body.token_ids], body.max_new_tokens, body.num_beams,
                          asyncio.get_running_loop().create_future())
        await state["batcher"].queue.put(pending)
        out = [index[t] for t in await pending.answer]
        return {"model": body.model or model_dir.name, "text": "", "token_ids": out,
                "finish_reason": "length" if len(out) >= body.max_new_tokens else "stop",
                "usage": {"prompt_tokens": len(body.token_ids), "completion_tokens": len(out),
                          "total_tokens": len(body.token_ids) + len(out)}}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a CTranslate2 model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2's intra_threads")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long a batch waits for more requests")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.max_batch_size < 1 or args.batch_wait_ms < 0:
        parser.error("--threads and --max-batch-size must be >= 1, --batch-wait-ms >= 0")
    app = create_app(args.model, args.threads, args.max_batch_size, args.batch_wait_ms / 1000)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
