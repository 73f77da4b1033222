"""The HTTP face of `hotrod serve`: request validation, tokenization and the OpenAI-shaped endpoints.

Everything model-specific sits behind the `Engine` protocol, so this module knows models only by their
`ModelInfo`: it refuses what a model cannot take (wrong kind, too long, ids outside the vocabulary) before
the request occupies a slot, and it lets go of the slot as soon as nobody wants the answer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from hotrod.serve.http_errors import (
    ApiError,
    JsonBodies,
    Recorder,
    embed_rows,
    engine_error,
    exactly_one,
    install_error_handlers,
    new_tokens,
    resolve,
    token_ids,
)
from hotrod.serve.metrics import Metrics
from hotrod.serve.protocol import Engine, Params, Ticket
from hotrod.serve.schemas import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    EmbeddingData,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorBody,
    GenerateRequest,
    GenerateResponse,
    ModelCard,
    ModelList,
    ServeLimits,
    Usage,
)
from hotrod.serve.sse import TicketReader, collect, stream
from hotrod.version import __version__

log = logging.getLogger("hotrod.serve")

GENERATORS = ("decoder", "seq2seq")
ENCODERS = ("encoder",)
_ENDPOINTS = {"/v1/generate": "generate", "/v1/embed": "embed", "/v1/completions": "completions",
              "/v1/embeddings": "embeddings"}
_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (400, 404, 422, 429, 500, 503, 504)}
_STREAMED = {**_ERRORS, 200: {"description": "JSON, or with `stream: true` server-sent events ending in "
                                             "`data: [DONE]`", "content": {"text/event-stream": {}}}}

router = APIRouter()


def create_app(engines: dict[str, Engine], options: ServeLimits | None = None,
               metrics: Metrics | None = None) -> FastAPI:
    """An app serving `engines` under their dict keys. It does not start them: `serve()` does."""
    if not engines:
        raise ValueError("create_app needs at least one engine")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if app.state.starter is not None:
            app.state.starter.start()
        yield
        await _drain(app)

    app = FastAPI(title="hotrod", version=__version__, lifespan=lifespan,
                  description="Fast T5, GPT-2 and BERT models, with OpenAI-compatible endpoints.")
    app.state.engines = dict(engines)
    app.state.limits = options or ServeLimits()
    app.state.metrics = metrics or Metrics()
    app.state.endpoints = _ENDPOINTS
    app.state.shutting_down = False
    app.state.starter = None  # serve() puts the thread that starts the engines here
    install_error_handlers(app)
    app.add_middleware(JsonBodies)
    app.include_router(router)
    return app


async def _drain(app: FastAPI) -> None:
    """At shutdown: refuse new work, let the engines finish what they hold, then stop them."""
    app.state.shutting_down = True
    if app.state.starter is not None and app.state.starter.is_alive():
        await asyncio.to_thread(app.state.starter.join)
    engines = app.state.engines
    stops = [asyncio.to_thread(functools.partial(engine.stop, drain=True)) for engine in engines.values()]
    for name, result in zip(engines, await asyncio.gather(*stops, return_exceptions=True)):
        if isinstance(result, BaseException):
            log.error("model %s did not stop cleanly: %r", name, result)


def _submit(request: Request, submit: Callable[[], Ticket]) -> TicketReader:
    """The ticket of a submitted request, read under the server's timeout; a refusal is its 4xx/5xx."""
    try:
        ticket = submit()
    except Exception as exc:  # QueueFull 429, ShuttingDown 503, HotrodError 400, anything else 500
        error = engine_error(exc)
        if error.status == 500:
            log.error("submitting to %s failed: %r", request.state.recorder.model, exc, exc_info=exc)
        raise error from None
    return TicketReader(ticket, request, request.app.state.limits.request_timeout_s)


def _json(body: Any, recorder: Recorder) -> Response:
    recorder.done("ok")
    return Response(body.model_dump_json(), media_type="application/json")


def _usage(prompt: int, completion: int = 0) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _sampling(temperature: float | None, do_sample: bool) -> dict[str, Any]:
    """Temperature 0 means greedy whatever else is asked, as in OpenAI's API."""
    if not do_sample or not temperature:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature}


# -- endpoints --------------------------------------------------------------------------------------------

@router.post("/v1/generate", response_model=GenerateResponse, responses=_STREAMED)
async def generate(body: GenerateRequest, request: Request) -> Response:
    """Generate from text or token ids; `stream: true` answers with one server-sent event per step."""
    engine, recorder = resolve(request, "generate", body.model, GENERATORS)
    where = exactly_one(body.text, body.token_ids, "text", "token_ids")
    prompt = token_ids(engine, body.text if body.text is not None else body.token_ids or [], where)
    new = new_tokens(request, engine, prompt, body.max_new_tokens, where, "max_new_tokens")
    params = Params(max_new_tokens=new, top_k=body.top_k, top_p=body.top_p, num_beams=body.num_beams,
                    repetition_penalty=body.repetition_penalty, seed=body.seed,
                    **_sampling(body.temperature, body.do_sample))
    reader = _submit(request, functools.partial(engine.submit_generate, prompt, params))
    name = recorder.model
    if body.stream:
        def chunk(text: str, ids: list[int], finish: str | None, usage: dict | None) -> dict[str, Any]:
            return {"model": name, "text": text, "token_ids": ids, "finish_reason": finish,
                    **({"usage": usage} if usage else {})}

        return await stream(reader, recorder, engine.decode, len(prompt), chunk)
    tokens, last = await collect(reader)
    return _json(GenerateResponse(model=name, text=engine.decode(tokens), token_ids=tokens,
                                  finish_reason=last.finish_reason or "stop",
                                  usage=_usage(len(prompt), len(tokens))), recorder)


@router.post("/v1/completions", response_model=CompletionResponse, responses=_STREAMED)
async def completions(body: CompletionRequest, request: Request) -> Response:
    """OpenAI's completions endpoint: one prompt (text or token ids), one choice, optional streaming."""
    engine, recorder = resolve(request, "completions", body.model, GENERATORS)
    if body.stop:  # null, "" and [] all mean "no stop sequences"
        raise ApiError(400, "stop: stop sequences are not supported", "stop")
    prompt = token_ids(engine, body.prompt, "prompt")
    new = new_tokens(request, engine, prompt, body.max_tokens, "prompt", "max_tokens")
    params = Params(max_new_tokens=new, top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed,
                    **_sampling(body.temperature, True))
    reader = _submit(request, functools.partial(engine.submit_generate, prompt, params))
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": recorder.model}
    if body.stream:
        def chunk(text: str, ids: list[int], finish: str | None, usage: dict | None) -> dict[str, Any]:
            choice = {"text": text, "index": 0, "finish_reason": finish, "logprobs": None}
            return {**head, "choices": [choice], **({"usage": usage} if usage else {})}

        return await stream(reader, recorder, engine.decode, len(prompt), chunk)
    tokens, last = await collect(reader)
    choice = CompletionChoice(text=engine.decode(tokens), finish_reason=last.finish_reason)
    return _json(CompletionResponse(**head, choices=[choice], usage=_usage(len(prompt), len(tokens))), recorder)


async def _embed(request: Request, engine: Engine, rows: list[list[int]], pooling: str,
                 normalize: bool) -> list[list[float]]:
    reader = _submit(request, functools.partial(engine.submit_embed, rows, pooling, normalize))
    _, last = await collect(reader)
    vectors = last.result.tolist() if last.result is not None else []
    if len(vectors) != len(rows):
        raise ApiError(500, f"the model returned {len(vectors)} embeddings for {len(rows)} inputs")
    return vectors


@router.post("/v1/embed", response_model=EmbedResponse, responses=_ERRORS)
async def embed(body: EmbedRequest, request: Request) -> Response:
    """Embed texts or token id rows with an encoder model."""
    engine, recorder = resolve(request, "embed", body.model, ENCODERS)
    param = exactly_one(body.texts, body.token_ids, "texts", "token_ids")
    rows = embed_rows(engine, body.texts if body.texts is not None else body.token_ids or [], param)
    vectors = await _embed(request, engine, rows, body.pooling, body.normalize)
    usage = _usage(sum(map(len, rows)))
    return _json(EmbedResponse(model=recorder.model, embeddings=vectors, usage=usage), recorder)


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=_ERRORS)
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """OpenAI's embeddings endpoint: mean-pooled, unit-length vectors."""
    engine, recorder = resolve(request, "embeddings", body.model, ENCODERS)
    items = body.input
    if isinstance(items, str) or (items and isinstance(items[0], int)):
        items = [items]  # one text, or one row of token ids
    rows = embed_rows(engine, items, "input")  # type: ignore[arg-type]
    vectors = await _embed(request, engine, rows, "mean", True)
    data = [EmbeddingData(index=i, embedding=vector) for i, vector in enumerate(vectors)]
    usage = _usage(sum(map(len, rows)))
    return _json(EmbeddingsResponse(data=data, model=recorder.model, usage=usage), recorder)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request) -> ModelList:
    """The served models, in OpenAI's list shape (plus each one's kind)."""
    return ModelList(data=[ModelCard(id=name, created=engine.info.created, kind=engine.info.kind)
                           for name, engine in request.app.state.engines.items()])


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: answers as long as the process serves HTTP, even while models load."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"model": ErrorBody}})
async def ready(request: Request) -> dict[str, Any]:
    """Readiness: 200 once every model is started, 503 while loading or shutting down."""
    state = request.app.state
    if state.shutting_down:
        raise ApiError(503, "the server is shutting down")
    loading = [name for name, engine in state.engines.items() if not engine.ready()]
    if loading:
        raise ApiError(503, f"not ready: still loading {', '.join(loading)}")
    return {"status": "ready", "models": list(state.engines)}


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus' text format, from the server's own registry."""
    return Response(request.app.state.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


# -- running ----------------------------------------------------------------------------------------------

class StartupFailed(RuntimeError):
    """A model could not be started; the server shut down without serving it."""


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app the moment a shutdown signal arrives so new requests get 503."""

    def __init__(self, config: uvicorn.Config, app: FastAPI):
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.app.state.shutting_down = True
        super().handle_exit(sig, frame)


def serve(engines: dict[str, Engine], limits: ServeLimits | None = None, host: str = "127.0.0.1",
          port: int = 8000, metrics: Metrics | None = None, *, log_level: str = "info",
          access_log: bool = True) -> None:
    """Serve `engines` over HTTP until SIGTERM or SIGINT, then drain and return.

    The engines start on a thread while the server already answers /health; /ready turns 200 when they
    all have. On a signal, new requests get 503, uvicorn waits for the open responses (streams included)
    to finish, and the lifespan stops each engine with drain=True. uvicorn re-raises a captured SIGTERM
    once done, so the process ends with the signal's status, as under uvicorn's own CLI.
    """
    app = create_app(engines, limits, metrics)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            lifespan="on", timeout_graceful_shutdown=None)
    server = _Server(config, app)
    failures: list[str] = []

    def start_all() -> None:
        for name, engine in engines.items():
            if app.state.shutting_down:
                return
            try:
                engine.start()
            except Exception as exc:  # a model that cannot load ends the server, with one line saying why
                failures.append(f"model {name} failed to start: {exc}")
                log.error("%s", failures[-1])
                app.state.shutting_down = True
                server.should_exit = True
                return
            log.info("model %s is ready", name)

    app.state.starter = threading.Thread(target=start_all, name="hotrod-start", daemon=True)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled; the shutdown is already done
        pass
    if failures:
        raise StartupFailed(failures[0])
