"""The HTTP face of `hotrod serve`: the app, its probes, and running it under uvicorn.

Everything model-specific sits behind the `Worker` protocol, so the HTTP layer knows models only by their
`ModelInfo`. A request passes the gate (key, media type, size: `gate.py`), then its endpoint's checks
(`checks.py`), and only then takes a slot; it lets go of the slot as soon as nobody wants the answer.
hotrod's own and OpenAI's routes are under /v1; the Open Inference Protocol's under /v2
(`inference_protocol.py`), whose health probes are here, beside /health and /ready.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CONTENT_TYPE_LATEST

from hotrod import tasks
from hotrod.serve import completions, embeddings, endpoints, inference_protocol, task_routes, tei, tei_embed
from hotrod.serve.gate import Gate
from hotrod.serve.http_errors import TEI_ROUTES, ApiError, install_error_handlers
from hotrod.serve.limits import Access, ServeLimits
from hotrod.serve.messages import Worker
from hotrod.serve.metrics import Metrics
from hotrod.serve.schemas import ErrorBody, ModelCard, ModelList
from hotrod.serve.tensors import HEADER
from hotrod.version import __version__

log = logging.getLogger("hotrod.serve")

_ENDPOINTS = {"/v1/generate": "generate", "/v1/embed": "embed", "/v1/completions": "completions",
              "/v1/embeddings": "embeddings", "/predict": "predict", "/rerank": "tei_rerank", "/embed": "tei_embed",
              "/embed_all": "tei_embed_all", "/tokenize": "tei_tokenize", "/decode": "tei_decode",
              "/similarity": "tei_similarity"}
router = APIRouter()


def create_app(workers: dict[str, Worker], options: ServeLimits | None = None,
               metrics: Metrics | None = None, access: Access | None = None) -> FastAPI:
    """An app serving `workers` under their dict keys. It does not start them: `serve()` does."""
    if not workers:
        raise ValueError("create_app needs at least one worker")
    access = access or Access()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if app.state.starter is not None:
            app.state.starter.start()
        try:
            yield
            await _drain(app)
        finally:
            for pool in app.state.tokenizers.values():
                pool.shutdown(wait=False, cancel_futures=True)

    docs = {} if access.docs else {"docs_url": None, "redoc_url": None}
    app = FastAPI(title="hotrod", version=__version__, lifespan=lifespan, **docs,
                  description="Fast T5, GPT-2 and BERT models, with OpenAI-compatible endpoints.")
    app.state.workers = dict(workers)
    app.state.limits = options or ServeLimits()
    app.state.metrics = metrics or Metrics()
    app.state.endpoints = {**_ENDPOINTS, **{s.route.path: s.route.endpoint for s in tasks.all_specs() if s.route}}
    app.state.shutting_down = False
    app.state.starter = None  # serve() puts the thread that starts the workers here
    # One thread per model's tokenizer: off the event loop, and never two threads in one tokenizer.
    app.state.tokenizers = {name: ThreadPoolExecutor(1, thread_name_prefix=f"hotrod-tokenize-{name}")
                            for name in workers}
    install_error_handlers(app)
    app.add_middleware(Gate, api_key=access.api_key, max_bytes=app.state.limits.max_request_bytes)
    if access.cors_origins:  # outside the gate, so that preflights and refusals carry CORS headers
        app.add_middleware(CORSMiddleware, allow_origins=list(access.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", HEADER], expose_headers=[HEADER])
    for module in (endpoints, embeddings, completions, tei, tei_embed, inference_protocol):
        app.include_router(module.router)
    app.include_router(task_routes.router())
    app.include_router(router)
    app.openapi = functools.partial(_openapi, app, app.openapi)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI, build: Any) -> dict[str, Any]:
    """FastAPI's schema without the 422 it adds to every route with a body: only TEI's routes answer 422
    (declared with TEI's error body); the others answer an invalid field 400, as OpenAI does."""
    if app.openapi_schema is None:
        schema = build()
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                if path not in TEI_ROUTES:
                    operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        if "HTTPValidationError" not in json.dumps(schema["paths"]):
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
    return app.openapi_schema


async def _drain(app: FastAPI) -> None:
    """At shutdown: refuse new work, let the workers finish what they hold (within the shutdown timeout),
    then stop them; past the timeout what is left is failed, so shutting down never hangs."""
    app.state.shutting_down = True
    timeout = app.state.limits.shutdown_timeout_s
    if app.state.starter is not None and app.state.starter.is_alive():
        await asyncio.to_thread(app.state.starter.join, timeout)
    workers = app.state.workers
    stops = [asyncio.to_thread(functools.partial(worker.stop, drain=True, timeout=timeout))
             for worker in workers.values()]
    for name, result in zip(workers, await asyncio.gather(*stops, return_exceptions=True)):
        if isinstance(result, BaseException):
            log.error("model %s did not stop cleanly: %r", name, result)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request) -> ModelList:
    """The served models, in OpenAI's list shape (plus each one's kind)."""
    return ModelList(data=[ModelCard(id=name, created=worker.info.created, kind=worker.info.kind)
                           for name, worker in request.app.state.workers.items()])


@router.get("/v1/models/{name:path}", response_model=ModelCard, responses={404: {"model": ErrorBody}})
async def model_card(name: str, request: Request) -> ModelCard:
    """One served model, in OpenAI's shape (the official client's `models.retrieve`); a 404 naming it otherwise."""
    worker = request.app.state.workers.get(name)
    if worker is None:
        raise ApiError(404, f"model: '{name}' is not served here; served: {', '.join(request.app.state.workers)}",
                       "model")
    return ModelCard(id=name, created=worker.info.created, kind=worker.info.kind)


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: answers as long as the process serves HTTP, even while models load."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"model": ErrorBody}})
async def ready(request: Request) -> dict[str, Any]:
    """Readiness: 200 once every model is started, 503 while loading, shutting down or after a model failed."""
    state = request.app.state
    failed = [name for name, worker in state.workers.items() if worker.failure()]
    if failed:
        raise ApiError(503, f"not ready: model {', '.join(failed)} has failed; the server is exiting")
    if state.shutting_down:
        raise ApiError(503, "the server is shutting down")
    loading = [name for name, worker in state.workers.items() if not worker.ready()]
    if loading:
        raise ApiError(503, f"not ready: still loading {', '.join(loading)}")
    return {"status": "ready", "models": list(state.workers)}


@router.get("/v2/health/live")
async def live() -> dict[str, bool]:
    """The Open Inference Protocol's liveness: /health."""
    return {"live": True}


@router.get("/v2/health/ready", responses={503: {"model": inference_protocol.V2Error}})
async def v2_ready(request: Request) -> dict[str, bool]:
    """The Open Inference Protocol's readiness: /ready, in its shape."""
    await ready(request)
    return {"ready": True}


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus' text format, from the server's own registry."""
    return Response(request.app.state.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


# -- running ----------------------------------------------------------------------------------------------

class StartupFailed(RuntimeError):
    """A model could not be started, or its worker died: the server shut down and the process should end
    non-zero, so that a supervisor restarts it."""


WATCH_S = 0.25  # how often the starter thread, once the workers run, checks that their threads live


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app the moment a shutdown signal arrives so new requests get 503."""

    def __init__(self, config: uvicorn.Config, app: FastAPI):
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.app.state.shutting_down = True
        super().handle_exit(sig, frame)


def _log_beside_uvicorn(level: str) -> None:
    """hotrod's own log lines (a model ready, an embeddings request's `user`, a request's failure under its id)
    on the console as uvicorn writes its own, at the same level, where nothing would write them; a process
    whose logging is configured (a handler on this logger or any above it, the root's included) keeps its own."""
    if log.hasHandlers():
        return
    from uvicorn.config import LOG_LEVELS
    from uvicorn.logging import DefaultFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=None))
    log.addHandler(handler)
    log.setLevel(LOG_LEVELS.get(level, logging.INFO))


def serve(workers: dict[str, Worker], limits: ServeLimits | None = None, host: str = "127.0.0.1",
          port: int = 8000, metrics: Metrics | None = None, *, log_level: str = "info",
          access_log: bool = True, access: Access | None = None) -> None:
    """Serve `workers` over HTTP until SIGTERM or SIGINT, then drain and return.

    The workers start on a thread while the server already answers /health; /ready turns 200 when they
    all have. The same thread then watches them: a model whose worker dies turns /ready 503 and shuts the
    server down, and `serve` raises StartupFailed. On a signal, new requests get 503, uvicorn waits up to
    the shutdown timeout for open responses (streams included), and the lifespan stops each worker,
    draining within the same bound. uvicorn re-raises a captured SIGTERM once done, so the process ends
    with the signal's status, as under uvicorn's own CLI. Connections beyond `max_connections` get
    uvicorn's 503.
    """
    limits = limits or ServeLimits()
    app = create_app(workers, limits, metrics, access)
    _log_beside_uvicorn(log_level)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            lifespan="on", timeout_graceful_shutdown=limits.shutdown_timeout_s,
                            limit_concurrency=limits.max_connections)
    server = _Server(config, app)
    failures: list[str] = []

    def fail(message: str) -> None:
        failures.append(message)
        log.error("%s", message)
        app.state.shutting_down = True
        server.should_exit = True

    def start_and_watch() -> None:
        for name, worker in workers.items():
            if app.state.shutting_down:
                return
            try:
                worker.start()
            except Exception as exc:  # a model that cannot load ends the server, with one line saying why
                return fail(f"model {name} failed to start: {exc}")
            log.info("model %s is ready", name)
        while not app.state.shutting_down:
            dead = next(((name, worker.failure()) for name, worker in workers.items() if worker.failure()), None)
            if dead is not None:
                return fail(f"model {dead[0]} stopped working: {dead[1]}")
            threading.Event().wait(WATCH_S)

    app.state.starter = threading.Thread(target=start_and_watch, name="hotrod-start", daemon=True)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled; the shutdown is already done
        pass
    if failures:
        raise StartupFailed(failures[0])
