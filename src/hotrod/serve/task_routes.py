"""The task routes: one POST route per task that has one (`hotrod.tasks.TaskSpec.route`), /v1/classify,
/v1/rerank (Cohere's shape, Jina's too), /v1/tag and /v1/answer among them.

Every route is the same five steps over the task's pipeline, so a route answers what the Python API
answers: resolve a served model the task runs on (`task_calls.task_worker`); check at the door what needs no
tokenizer (the route's `Door`: counts, emptiness, bytes; and its own `check`); `prepare` on the model's
tokenizer thread; run the rows in the worker's dynamic batches with other requests' rows (a 100-document
rerank is one submission); `finish` on the same thread, and the route's `respond` shapes the body.
text-embeddings-inference's routes are in `tei.py`.
"""

import inspect
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response

from hotrod import tasks
from hotrod.errors import HotrodError
from hotrod.serve import task_calls
from hotrod.serve.endpoints import ERRORS, TEI_ERRORS, usage
from hotrod.serve.http_errors import TEI_ROUTES, ApiError, Recorder
from hotrod.serve.schemas import Usage


@dataclass(frozen=True)
class Reply:
    """What a route's `respond` builds its body from, beside the request and the pipeline's answer."""

    model: str  # the served name
    tokens: int  # tokens the request ran
    rows: int  # rows it ran (a question's windows, a rerank's pairs)

    @property
    def usage(self) -> Usage:
        return usage(self.tokens)


def json_response(body: Any, recorder: Recorder) -> Response:
    """The body without its unset optional fields (a rerank result's document only when asked for)."""
    recorder.done("ok")
    return Response(body.model_dump_json(exclude_none=True), media_type="application/json")


def router() -> APIRouter:
    """A router with the route of every registered task that has one."""
    found = APIRouter()
    for spec in tasks.all_specs():
        if spec.route is not None and spec.pipeline is not None:
            _add(found, spec)
    return found


def _add(found: APIRouter, spec: tasks.TaskSpec) -> None:
    route = spec.route
    request_model, response_model = route.schemas()

    async def handle(body: Any, request: Request) -> Response:
        return await answer(spec, body, request)

    handle.__name__ = f"{route.endpoint}_route"
    handle.__doc__ = spec.summary[:1].upper() + spec.summary[1:] + "." if spec.summary else None
    handle.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=request_model),
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)])
    errors = TEI_ERRORS if route.path in TEI_ROUTES else ERRORS
    found.add_api_route(route.path, handle, methods=["POST"], response_model=response_model, responses=errors)


async def answer(spec: tasks.TaskSpec, body: Any, request: Request) -> Response:
    """A task route's answer to a validated request body."""
    route = spec.route
    worker, recorder = task_calls.task_worker(request, spec, route.endpoint, getattr(body, "model", None))
    door = route.door(body)
    task_calls.check_count(request, door.count, door.param, door.most)
    for param, texts, truncate in door.other:
        task_calls.check_texts(request, worker, texts, param, truncate)
    task_calls.check_texts(request, worker, door.texts, door.param, door.truncate)
    if route.check is not None:
        try:
            route.check(body, request.app.state.limits)
        except ValueError as exc:
            field, _, _ = str(exc).partition(":")
            raise ApiError(400, str(exc), field) from None
    step = _named(spec.pipeline.prepare, route.fields)
    prepared = await task_calls.prepare(request, worker, step, *route.arguments(body), param=door.param,
                                        bounded=route.bounded_rows)
    limit = request.app.state.limits.max_batch_inputs
    if len(prepared.rows) > limit:
        raise ApiError(400, f"{door.param}: it makes {len(prepared.rows)} {route.many}; this server runs at most "
                            f"{limit} per request (--max-batch-inputs)", door.param)
    found = await task_calls.answer(request, worker, spec.pipeline, prepared, door.param)
    reply = Reply(recorder.model, task_calls.tokens(prepared), len(prepared.rows))
    return json_response(route.respond(body, found, reply), recorder)


def _named(prepare: Any, fields: tuple[str, ...]) -> Any:
    """`prepare`, whose refusals that begin with one of `fields` (or "the <field>") name that field."""
    if not fields:
        return prepare

    def step(*args: Any) -> Any:
        try:
            return prepare(*args)
        except HotrodError as exc:
            message = str(exc)
            field = next((f for f in fields if message.startswith(("the " + f, f))), None)
            if field is None:
                raise
            raise task_calls.FieldError(field, message) from None

    return step
