"""What can be wrong with a request, and how the server says so: one error shape, one outcome per request.

Clients (OpenAI's among them) read `{"error": {"message", "type", "param"}}`; FastAPI's own errors (bad
JSON, a wrong-typed field, an unknown route) are converted to it, and an unexpected exception becomes a
plain 500 without a traceback. Under /v2 (the Open Inference Protocol) the same errors take that
protocol's shape, `{"error": "<message>"}`, which KServe and Triton clients read, and on TEI's routes TEI's,
`{"error", "error_type"}`. Each API request is counted once, under the outcome its status implies.
Which served model a request names is resolved here; the checks of its inputs are in `checks.py`.
Exception text from inside the server never reaches a client: a 500 names the request's id, and the log
holds the detail under the same id.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hotrod.errors import HotrodError, first_line
from hotrod.serve.messages import QueueFull, ShuttingDown, Worker, WorkerDown
from hotrod.serve.metrics import Metrics
from hotrod.serve.unicode_text import safe

log = logging.getLogger("hotrod.serve")

CLIENT_CLOSED = 499  # nginx's code for "the client went away"; nobody reads the answer

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", CLIENT_CLOSED: "cancelled",
          500: "server_error", 503: "unavailable_error", 504: "timeout_error"}
_OUTCOMES = {429: "rejected", CLIENT_CLOSED: "cancelled", 503: "unavailable", 504: "timeout"}


def outcome_of(status: int) -> str:
    """The metrics outcome of a request answered with `status`."""
    if status < 400:
        return "ok"
    return _OUTCOMES.get(status, "failed" if status >= 500 else "invalid")


class ApiError(Exception):
    """A request the server refuses or could not complete; `param` names the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers


V2_PREFIX = "/v2"
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/infer")  # its model is named in the path


def is_v2(path: str) -> bool:
    """Whether `path` is a route of the Open Inference Protocol (its own error shape)."""
    return path == V2_PREFIX or path.startswith(V2_PREFIX + "/")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    message, param = safe(message), None if param is None else safe(param)
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param}}


# text-embeddings-inference's own, at the root as TEI has them (/embed_sparse: the sparse-embedding task's route;
# POST /: the served model's main route)
TEI_ROUTES = ("/", "/predict", "/rerank", "/embed", "/embed_all", "/embed_sparse", "/similarity", "/tokenize",
              "/decode", "/info")


def tei_error_type(status: int) -> str:
    """TEI's `error_type` of a status."""
    if status == 429:
        return "overloaded"
    if status == 503:
        return "unhealthy"
    return "backend" if status >= 500 else "validation"


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None, *, path: str = "") -> JSONResponse:
    """The error answer of a request for `path`: the v2 protocol's shape under /v2, TEI's on its routes
    (`{"error", "error_type"}`), hotrod's elsewhere. A message that repeats a client's text is made safe to
    encode (`unicode_text.safe`): the refusal must not fail where the request did."""
    message, param = safe(message), None if param is None else safe(param)
    if is_v2(path):
        body: dict[str, Any] = {"error": message}
    elif path in TEI_ROUTES:
        body = {"error": message, "error_type": tei_error_type(status)}
    else:
        body = error_body(status, message, param)
    return JSONResponse(body, status_code=status, headers=headers)


class Recorder:
    """Counts one request once: the first outcome reported wins, later ones (a cleanup path) are ignored."""

    def __init__(self, metrics: Metrics, endpoint: str, model: str = "unknown"):
        self.metrics = metrics
        self.endpoint = endpoint
        self.model = model
        self.start = time.perf_counter()
        self.recorded: str | None = None

    def done(self, outcome: str) -> None:
        if self.recorded is None:
            self.recorded = outcome
            self.metrics.request(self.model, self.endpoint, outcome, time.perf_counter() - self.start)


def model_label(workers: dict[str, Any], name: Any) -> str:
    """The metrics label of a request for `name`: a served name, never a client's arbitrary string."""
    if isinstance(name, str) and name in workers:
        return name
    return next(iter(workers)) if name is None and len(workers) == 1 else "unknown"


def record(request: Request, status: int, body: Any = None) -> None:
    """Count a refused request once, under the outcome its status implies (its model, if the body named one)."""
    recorder: Recorder | None = getattr(request.state, "recorder", None)
    if recorder is None:
        path = request.url.path
        endpoint = request.app.state.endpoints.get(path)
        name = body.get("model") if isinstance(body, dict) else None
        infer = INFER_PATH.fullmatch(path)
        if infer is not None:
            endpoint, name = "infer", infer.group(1)
        if endpoint is None:  # not an API endpoint: /health, an unknown route...
            return
        recorder = Recorder(request.app.state.metrics, endpoint, model_label(request.app.state.workers, name))
    recorder.done(outcome_of(status))


def _validation_error(exc: RequestValidationError) -> tuple[int, str, str | None]:
    """FastAPI's list of errors as (status, message naming the first offending field, that field): 422, as
    FastAPI and TEI answer, where the body parsed.

    A union field (prompt: str | list[int] | list[str]) reports errors per member; those of the member the value
    came closest to say most (`_closest`: `prompt[2]: Input should be a valid string` for ["a", "b", null]).
    """
    errors = exc.errors()
    if not errors:
        return 422, "the request is invalid", None
    if errors[0].get("type") == "json_invalid":
        reason = (errors[0].get("ctx") or {}).get("error", "it could not be parsed")
        return 400, f"the request body is not valid JSON: {reason}", None

    def path(error: Any) -> list[Any]:
        return [part for part in error.get("loc", ()) if part != "body"]

    field = next(iter(path(errors[0])), None)
    param = field if isinstance(field, str) else None
    first = _closest([e for e in errors if next(iter(path(e)), None) == field], path)
    where = (param or "body") + "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                                        for part in path(first)[1:] if isinstance(part, int) or _is_field(part))
    message = "unknown field" if first.get("type") == "extra_forbidden" else first.get("msg", "invalid value")
    return 422, f"{where}: {message}", param


def _is_field(part: Any) -> bool:
    """Whether a part of an error's place is a field of a nested object (parameters.top_k) rather than the union
    member it was tried as (`str`, `list[int]`, a model's class name)."""
    return isinstance(part, str) and part.isidentifier() and part[:1].islower() and part not in _TYPE_NAMES


_TYPE_NAMES = ("str", "int", "float", "bool", "list", "dict", "none")


def _closest(errors: list[Any], path: Any) -> Any:
    """The error to name among one field's: with a union, of the member whose outer type the value has (its
    errors lie inside it) and that has the fewest, the deepest and latest (["a", 5]: the first item set the
    type, the second broke it); the deepest of all where none matched further than its type."""
    members: dict[Any, list[Any]] = {}
    for error in errors:
        where = path(error)
        if len(where) > 2 and isinstance(where[1], str):  # (field, member, inside...): the member's type matched
            members.setdefault(where[1], []).append(error)
    if not members:
        return max(errors, key=lambda e: len(path(e)))

    def place(error: Any) -> tuple[int, ...]:
        return (len(path(error)), *(part for part in path(error) if isinstance(part, int)))

    found = min(members.values(), key=lambda group: (len(group), tuple(-x for x in max(map(place, group)))))
    return max(found, key=place)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI, Starlette or the app raises through the one error shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        record(request, exc.status)
        return error_response(exc.status, exc.message, exc.param, exc.headers, path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message, param = _validation_error(exc)
        if request.url.path not in TEI_ROUTES:  # OpenAI's API answers every invalid parameter 400 (TEI: 422)
            status = 400
        record(request, status, exc.body)
        return error_response(status, message, param, path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        record(request, exc.status_code)
        return error_response(exc.status_code, str(exc.detail), None, getattr(exc, "headers", None),
                              path=request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = request_id_of(request)
        log.error("request %s: unexpected error on %s %s: %r", request_id, request.method, request.url.path, exc,
                  exc_info=exc)
        record(request, 500)
        return error_response(500, f"internal server error (request id {request_id})", path=request.url.path)


def request_id_of(request: Request) -> str:
    """The id the gate gave this request (also in its `X-Request-ID` header)."""
    return getattr(request.state, "request_id", None) or "unknown"


# -- the checks a request must pass before it takes a slot ------------------------------------------------

def resolve(request: Request, endpoint: str, name: str | None, kinds: tuple[str, ...]) -> tuple[Worker, Recorder]:
    """The worker a request names, once known to be served, of the right kind and ready; starts its record."""
    state = request.app.state
    recorder = Recorder(state.metrics, endpoint, model_label(state.workers, name))
    request.state.recorder = recorder
    if state.shutting_down:
        raise ApiError(503, "the server is shutting down")
    served = ", ".join(state.workers)
    if name is None:
        if len(state.workers) != 1:
            raise ApiError(400, f"model: required when several models are served ({served})", "model")
        name = next(iter(state.workers))
    elif name not in state.workers:
        raise ApiError(404, f"model: '{name}' is not served here; served: {served}", "model")
    worker = state.workers[name]
    if worker.info.kind not in kinds:
        raise ApiError(400, f"model: '{name}' is a model of kind {worker.info.kind}; {request.url.path} needs "
                            f"one of kind {' or '.join(kinds)}", "model")
    check_running(name, worker)
    return worker, recorder


def check_running(name: str, worker: Worker) -> None:
    """Refuse (503) a model that has failed or is still loading."""
    if worker.failure():
        raise ApiError(503, f"model '{name}' has failed; the server is restarting")
    if not worker.ready():
        raise ApiError(503, f"model '{name}' is still loading")


def worker_error(exc: BaseException, request_id: str) -> ApiError:
    """The answer to a worker refusing a request at submission or failing it later."""
    if isinstance(exc, QueueFull):
        return ApiError(429, str(exc), headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
    if isinstance(exc, ShuttingDown | WorkerDown):
        return ApiError(503, str(exc))
    if isinstance(exc, HotrodError):
        return ApiError(400, first_line(exc))
    log.error("request %s failed: %s", request_id, first_line(exc), exc_info=exc)
    return ApiError(500, f"the model failed on this request; the server log has the detail (request id {request_id})")
