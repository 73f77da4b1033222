"""hotrod's own generation and embedding endpoints, and OpenAI's embeddings endpoint.

Each one resolves its model, checks its inputs (`checks.py`) and only then submits: a refused request
never takes a slot. OpenAI's completions endpoint, which has more to it, is in `completions.py`.
"""

from __future__ import annotations

import base64
import functools
import logging
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

from hotrod import kinds, tasks
from hotrod.serve.checks import embed_rows, exactly_one, new_tokens, prompt_lookup, token_ids
from hotrod.serve.http_errors import ApiError, Recorder, resolve
from hotrod.serve.messages import Params, Worker
from hotrod.serve.schemas import (
    EmbeddingData,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorBody,
    GenerateRequest,
    GenerateResponse,
    Sampling,
    Usage,
)
from hotrod.serve.sse import collect, stream, submit

GENERATORS = kinds.names(lambda kind: kind.generates)  # the kinds each route serves
ENCODERS = kinds.names(lambda kind: not kind.generates)
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody}
                                           for s in (400, 401, 404, 413, 415, 422, 429, 500, 503, 504)}
STREAMED = {**ERRORS, 200: {"description": "JSON, or with `stream: true` server-sent events ending in "
                                           "`data: [DONE]`", "content": {"text/event-stream": {}}}}

log = logging.getLogger("hotrod.serve")
router = APIRouter()


def json_response(body: Any, recorder: Recorder) -> Response:
    recorder.done("ok")
    return Response(body.model_dump_json(), media_type="application/json")


def usage(prompt: int, completion: int = 0) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def sampling(temperature: float | None, do_sample: bool) -> dict[str, Any]:
    """Temperature 0 means greedy whatever else is asked, as in OpenAI's API."""
    if not do_sample or not temperature:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature}


def generation_params(body: Sampling, new: int, worker: Worker, where: str = "speculate") -> Params:
    """The worker's parameters of a checked request that generates `new` tokens (`where` names its
    speculate field in a refusal)."""
    return Params(max_new_tokens=new, top_k=body.top_k, top_p=body.top_p, num_beams=body.num_beams,
                  repetition_penalty=body.repetition_penalty, seed=body.seed,
                  prompt_lookup=prompt_lookup(worker, body.speculate, body.num_beams, where),
                  **sampling(body.temperature, body.do_sample))


@router.post("/v1/generate", response_model=GenerateResponse, responses=STREAMED)
async def generate(body: GenerateRequest, request: Request) -> Response:
    """Generate from text or token ids; `stream: true` answers with one server-sent event per step."""
    worker, recorder = resolve(request, "generate", body.model, GENERATORS)
    where = exactly_one(body.text, body.token_ids, "text", "token_ids")
    prompt = await token_ids(request, worker, body.text if body.text is not None else body.token_ids or [], where)
    new = new_tokens(request, worker, prompt, body.max_new_tokens, where, "max_new_tokens")
    reader = submit(request, functools.partial(worker.submit_generate, prompt, generation_params(body, new, worker)))
    name = recorder.model
    if body.stream:
        def chunk(text: str, ids: list[int], finish: str | None, usage: dict | None) -> dict[str, Any]:
            return {"model": name, "text": text, "token_ids": ids, "finish_reason": finish,
                    **({"usage": usage} if usage else {})}

        return await stream(reader, recorder, worker.decode, len(prompt), chunk)
    tokens, last = await collect(reader)
    return json_response(GenerateResponse(model=name, text=worker.decode(tokens), token_ids=tokens,
                                          finish_reason=last.finish_reason or "stop",
                                          usage=usage(len(prompt), len(tokens))), recorder)


def check_embeds(worker: Worker) -> None:
    """An encoder that ends in a task head has no embeddings: a 400 naming its task and its routes."""
    task = worker.info.task
    if task is not None and not tasks.get(task).embeds:
        routes = [s.route.path for s in tasks.all_specs() if s.route and s.refusal(task, len(worker.info.labels)) is None]
        raise ApiError(400, f"model: '{worker.info.name}' is a {task} model, which has no embeddings; use "
                            f"{', '.join(routes + ['/v2 infer'])}", "model")


def check_dimensions(dimensions: int | None, width: int) -> None:
    """`dimensions` at most the model's width (0: not known yet)."""
    if dimensions is not None and width and dimensions > width:
        raise ApiError(400, f"dimensions: {dimensions} is more than the {width} numbers of this model's vectors",
                       "dimensions")


def openai_vector(vector: list[float], dimensions: int | None, encoding_format: str) -> list[float] | str:
    """One vector as OpenAI's API returns it: its first `dimensions` numbers made unit length again, as
    numbers or as the base64 of their little-endian float32 bytes."""
    values = np.asarray(vector, dtype=np.float32)
    if dimensions is not None:
        values = values[:dimensions]
        values = values / max(float(np.linalg.norm(values)), 1e-12)
    if encoding_format == "base64":
        return base64.b64encode(values.astype("<f4").tobytes()).decode("ascii")
    return values.tolist()


async def embed_vectors(request: Request, worker: Worker, rows: list[list[int]], pooling: str,
                        normalize: bool) -> list[list[float]]:
    """The embeddings of checked rows, one per row."""
    reader = submit(request, functools.partial(worker.submit_embed, rows, pooling, normalize))
    _, last = await collect(reader)
    vectors = last.result.tolist() if last.result is not None else []
    if len(vectors) != len(rows):
        raise ApiError(500, f"the model returned {len(vectors)} embeddings for {len(rows)} inputs")
    return vectors


@router.post("/v1/embed", response_model=EmbedResponse, responses=ERRORS)
async def embed(body: EmbedRequest, request: Request) -> Response:
    """Embed texts or token id rows with an encoder model."""
    worker, recorder = resolve(request, "embed", body.model, ENCODERS)
    check_embeds(worker)
    param = exactly_one(body.texts, body.token_ids, "texts", "token_ids")
    items = body.texts if body.texts is not None else body.token_ids or []
    rows = await embed_rows(request, worker, items, param)
    vectors = await embed_vectors(request, worker, rows, body.pooling, body.normalize)
    return json_response(EmbedResponse(model=recorder.model, embeddings=vectors,
                                       usage=usage(sum(map(len, rows)))), recorder)


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=ERRORS)
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """OpenAI's embeddings endpoint: mean-pooled, unit-length vectors, as numbers or as base64 (what the
    official client asks for by default), cut to `dimensions` and made unit length again where asked."""
    worker, recorder = resolve(request, "embeddings", body.model, ENCODERS)
    check_embeds(worker)
    check_dimensions(body.dimensions, worker.info.width)
    if body.user is not None:
        log.info("embeddings for user %r on model %s", body.user, worker.info.name)
    items = body.input
    if isinstance(items, str) or (items and isinstance(items[0], int)):
        items = [items]  # one text, or one row of token ids
    rows = await embed_rows(request, worker, items, "input")  # type: ignore[arg-type]
    vectors = await embed_vectors(request, worker, rows, "mean", True)
    check_dimensions(body.dimensions, len(vectors[0]))
    data = [EmbeddingData(index=i, embedding=openai_vector(vector, body.dimensions, body.encoding_format))
            for i, vector in enumerate(vectors)]
    return json_response(EmbeddingsResponse(data=data, model=recorder.model, usage=usage(sum(map(len, rows)))),
                         recorder)
