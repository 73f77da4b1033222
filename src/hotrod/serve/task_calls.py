"""A task's rows through a served encoder head: checked at the door, prepared off the event loop, run in the
worker's dynamic batches with every other request's rows.

The routes of `task_routes.py` and `tei.py` are each four steps over `hotrod.pipelines`: resolve a model the
task runs on (`task_worker`), check what needs no tokenizer (counts, emptiness, bytes), `prepare` (the pipeline's
own checks and tokenization, on the model's tokenizer thread), `run` (the worker batches the rows with
other requests'; the scheduler sees only their lengths) and `finish` (the pipeline's answer, on the same
thread). A pipeline's HotrodError is the client's fault by construction (an empty text, a pair missing a
side, an input past the model's positions without `truncate`), so it is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from fastapi import Request

from hotrod.errors import HotrodError, first_line
from hotrod.pipelines.base import Prepared, Row
from hotrod.serve.checks import check_bytes, input_limit
from hotrod.serve.endpoints import ENCODERS
from hotrod.serve.http_errors import TEI_ROUTES, ApiError, Recorder, resolve
from hotrod.serve.messages import Worker
from hotrod.serve.sse import collect, submit


class FieldError(HotrodError):
    """A pipeline's refusal about one field of the request other than the route's main one."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def task_worker(request: Request, spec: Any, endpoint: str, name: str | None) -> tuple[Worker, Recorder]:
    """The served model a request names, refused (400, naming its task) unless `spec` runs on it
    (`hotrod.tasks.TaskSpec.refusal`). TEI's routes name none (TEI serves one model): there it is the one
    served model `spec` runs on, whatever else is served."""
    if name is None and request.url.path in TEI_ROUTES and len(request.app.state.workers) > 1:
        name = one_served(request, spec, "name it with the request's model field")
    worker, recorder = resolve(request, endpoint, name, ENCODERS)
    found = worker.info.task or worker.info.kind
    labels = len(worker.info.labels)
    route = request.url.path
    refusal = _refusal(spec, worker, route)
    if refusal is None:
        return worker, recorder
    if found != spec.base:
        raise ApiError(400, f"model: '{worker.info.name}' is a {found} model; {route} needs a {spec.base} model",
                       "model")
    if spec.fits is not None and not spec.fits(labels):
        raise ApiError(400, f"model: '{worker.info.name}' has {labels} labels; {route} needs {spec.needs}", "model")
    raise ApiError(400, f"model: '{worker.info.name}': {refusal}", "model")


def _refusal(spec: Any, worker: Worker, call: str | None = None) -> str | None:
    """Why `spec` does not run on the served model (its task, else its kind; its labels), or None."""
    return spec.refusal(worker.info.task or worker.info.kind, len(worker.info.labels), call=call,
                        names=worker.info.labels)


def one_served(request: Request, spec: Any, choose: str) -> str:
    """The one served model `spec` runs on, for TEI's routes (TEI serves one model, so its clients name none);
    none, or several, is a 400 saying which are served (`choose`: how to name one)."""
    workers = request.app.state.workers
    fits = [name for name, worker in workers.items() if _refusal(spec, worker) is None]
    wanted = f"{spec.base} model" + (f" fit for {spec.name}: {spec.needs}" if spec.variant_of else "")
    if not fits:
        served = ", ".join(f"{name} ({worker.info.task or worker.info.kind}, {len(worker.info.labels)} labels)"
                           for name, worker in workers.items())
        raise ApiError(400, f"{request.url.path} needs a {wanted}; this server serves {served}")
    if len(fits) > 1:
        raise ApiError(400, f"{request.url.path} serves one {wanted}, and several are served ({', '.join(fits)}); "
                            f"{choose}")
    return fits[0]


def check_count(request: Request, count: int, param: str, most: int | None = None) -> None:
    """At least one input, and at most the server's `max_batch_inputs` (or `most`, if lower)."""
    if count < 1:
        raise ApiError(400, f"{param}: the list is empty", param)
    limit = request.app.state.limits.max_batch_inputs
    flag = "--max-batch-inputs"
    if most is not None and most < limit:
        limit, flag = most, "its most"
    if count > limit:
        raise ApiError(400, f"{param}: {count} inputs; this server takes at most {limit} per request ({flag})",
                       param)


def check_texts(request: Request, worker: Worker, texts: Sequence[tuple[str, Any]], param: str,
                truncate: bool) -> None:
    """Each (where, text) a non-empty string and, unless it will be truncated, short enough to tokenize."""
    limit = input_limit(request, worker)
    for where, text in texts:
        if not isinstance(text, str):
            raise ApiError(400, f"{where}: must be a string", param)
        if not text.strip():
            raise ApiError(400, f"{where}: the text is empty", param)
        if not truncate:
            check_bytes(text, limit, where, param)


async def prepare(request: Request, worker: Worker, step: Callable[..., Prepared], *args: Any,
                  param: str, bounded: bool = True) -> Prepared:
    """A pipeline's `prepare(model, *args)` on the model's tokenizer thread, its rows bounded by the server's
    input limit (which --max-input-tokens may set below the model's positions) unless the request sizes
    them itself (`bounded` False: a question's windows)."""
    prepared = await on_tokenizer(request, worker, step, *args, param=param)
    if not bounded:
        return prepared
    limit = input_limit(request, worker)
    for i, row in enumerate(prepared.rows):
        if len(row) > limit:
            raise ApiError(400, f"{param}: input {i} has {len(row)} tokens; this server takes at most {limit} per "
                                f"input for this model (send truncate: true to cut it)", param)
    return prepared


async def on_tokenizer(request: Request, worker: Worker, step: Callable[..., Any], *args: Any, param: str) -> Any:
    """`step(model, *args)` on the model's own tokenizer thread: off the event loop, one thread per tokenizer."""
    pool = request.app.state.tokenizers[worker.info.name]
    call = functools.partial(step, worker.pipeline_model(), *args)
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, call)
    except FieldError as exc:
        raise ApiError(400, f"{exc.field}: {first_line(exc)}", exc.field) from None
    except HotrodError as exc:
        raise ApiError(400, f"{param}: {first_line(exc)}", param) from None


async def run(request: Request, worker: Worker, rows: list[Row]) -> list[dict[str, torch.Tensor]]:
    """Each row's outputs, from the worker's dynamic batches (under the request's timeout and cancellation)."""
    reader = submit(request, functools.partial(worker.submit_rows, rows))
    _, last = await collect(reader)
    outputs = last.result if last.result is not None else []
    if len(outputs) != len(rows):
        raise ApiError(500, f"the model returned outputs of {len(outputs)} rows for {len(rows)}")
    return outputs


async def answer(request: Request, worker: Worker, module: Any, prepared: Prepared, param: str) -> Any:
    """A task's answer: its prepared rows run, then `module.finish` on the tokenizer thread (span searches
    and entity grouping are Python work that must not hold the event loop)."""
    outputs = await run(request, worker, prepared.rows)
    return await on_tokenizer(request, worker, module.finish, prepared, outputs, param=param)


def tokens(prepared: Prepared) -> int:
    """Tokens a request ran: its usage."""
    return sum(len(row) for row in prepared.rows)
