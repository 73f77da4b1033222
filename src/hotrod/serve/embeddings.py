"""Embeddings over HTTP, as the model itself gives them: hotrod's /v1/embed and OpenAI's /v1/embeddings here,
TEI's /embed and /embed_all (`tei_embed.py`) and the Open Inference Protocol's encoders on the same steps.

A served vector is `model.embed`'s: texts are tokenized by the checkpoint's own embedding pipeline
(`hotrod.pipelines.sentence_tokens`: its prompt, lowercasing and max_seq_length) on the model's tokenizer
thread, and the worker runs its pooling, Dense and Normalize modules in the dynamic batch. Only the
server's own limits differ: a text past the model's length is refused unless the request says `truncate`,
as TEI and OpenAI refuse it. A checkpoint without a sentence-transformers pipeline is mean-pooled and made
unit length where the request leaves normalization open, as the server always did.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

from hotrod import tasks
from hotrod.errors import HotrodError, first_line
from hotrod.pipelines.sentence_tokens import Tokenized
from hotrod.serve.checks import Item, check_bytes, check_token_row, exactly_one, input_limit
from hotrod.serve.endpoints import ENCODERS, ERRORS, json_response, usage
from hotrod.serve.http_errors import ApiError, resolve
from hotrod.serve.messages import Worker
from hotrod.serve.schemas import EmbeddingData, EmbeddingsRequest, EmbeddingsResponse, EmbedRequest, EmbedResponse
from hotrod.serve.sse import collect, submit

log = logging.getLogger("hotrod.serve")
router = APIRouter()


def check_embeds(worker: Worker) -> None:
    """An encoder that ends in a task head has no embeddings: a 400 naming its task and its routes."""
    task = worker.info.task
    if task is not None and not tasks.get(task).embeds:
        labels = worker.info.labels
        routes = [s.route.path for s in tasks.all_specs()
                  if s.route and s.refusal(task, len(labels), names=labels) is None]
        raise ApiError(400, f"model: '{worker.info.name}' is a {task} model, which has no embeddings; use "
                            f"{', '.join(routes + ['/v2 infer'])}", "model")


def check_dimensions(dimensions: int | None, width: int) -> None:
    """`dimensions` at most the model's width (0: not known yet)."""
    if dimensions is not None and width and dimensions > width:
        raise ApiError(400, f"dimensions: {dimensions} is more than the {width} numbers of this model's vectors",
                       "dimensions")


def own_normalize(worker: Worker, normalize: bool | None) -> bool | None:
    """The normalization a request gets: what it asks, else the checkpoint's own (None), and unit length for a
    checkpoint without a sentence-transformers pipeline."""
    if normalize is None and worker.info.sentence is None:
        return True
    return normalize


def chosen_prompt(worker: Worker, prompt: str | None, prompt_name: str | None, texts: bool) -> str | None:
    """The prompt put before each text: `prompt`, the named one or the checkpoint's default; token ids take
    none. An unknown name is a 400 naming `prompt_name`."""
    if prompt is not None and prompt_name is not None:
        raise ApiError(400, "prompt: give prompt or prompt_name, not both", "prompt")
    known = dict(worker.info.sentence.prompts) if worker.info.sentence is not None else {}
    if prompt_name is not None and prompt_name not in known:
        raise ApiError(400, f"prompt_name: unknown prompt_name {prompt_name!r}; model '{worker.info.name}' knows "
                            f"{', '.join(map(repr, known)) or 'no prompts'}", "prompt_name")
    if not texts:
        if prompt is not None or prompt_name is not None:
            field = "prompt" if prompt is not None else "prompt_name"
            raise ApiError(400, f"{field}: a prompt goes before text; token ids take none", field)
        return None
    if prompt is not None:
        return prompt
    return worker.info.sentence.resolve_prompt(None, prompt_name) if worker.info.sentence is not None else None


async def embedding_rows(request: Request, worker: Worker, items: Sequence[Item], param: str, prompt: str | None,
                         truncate: bool, side: str = "right", wheres: Sequence[str] | None = None) -> Tokenized:
    """The rows to embed, each refused like a prompt: texts through the model's embedding pipeline (on its
    tokenizer thread), or token id rows as they are."""
    if not items:
        raise ApiError(400, f"{param}: nothing to embed", param)
    most = request.app.state.limits.max_batch_inputs
    if len(items) > most:
        raise ApiError(400, f"{param}: {len(items)} inputs; this server takes at most {most} per request", param)
    wheres = wheres or [f"{param}[{i}]" for i in range(len(items))]
    limit = input_limit(request, worker)
    texts = [item for item in items if isinstance(item, str)]
    if texts and len(texts) != len(items):
        raise ApiError(400, f"{param}: give texts or token id rows, not both", param)
    if texts:
        for text, where in zip(texts, wheres):
            if not text.strip():
                raise ApiError(400, f"{where}: the text is empty", param)
            if not truncate:
                check_bytes(text, limit, where, param)
        tokenized = await _tokenize(request, worker, texts, prompt, truncate, side, param)
    else:
        tokenized = Tokenized([list(row) for row in items])  # type: ignore[arg-type]
    for row, where in zip(tokenized.rows, wheres):
        check_token_row(worker, row, limit, where, param)
    return tokenized


async def _tokenize(request: Request, worker: Worker, texts: list[str], prompt: str | None, truncate: bool,
                    side: str, param: str) -> Tokenized:
    pool = request.app.state.tokenizers[worker.info.name]
    call = functools.partial(worker.embedding_tokens, texts, prompt, truncate, side)
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, call)
    except HotrodError as exc:
        raise ApiError(400, f"{param}: {first_line(exc)}", param) from None


async def embed_vectors(request: Request, worker: Worker, tokenized: Tokenized, pooling: str | None,
                        normalize: bool | None) -> np.ndarray:
    """The embeddings [rows, width] of checked rows, from the worker's dynamic batches."""
    reader = submit(request, functools.partial(worker.submit_embed, tokenized.rows, pooling, normalize,
                                               tokenized.prompt_length))
    _, last = await collect(reader)
    vectors = last.result.float().numpy() if last.result is not None else np.zeros((0, 0), np.float32)
    if len(vectors) != len(tokenized.rows):
        raise ApiError(500, f"the model returned {len(vectors)} embeddings for {len(tokenized.rows)} inputs")
    return vectors.astype(np.float32, copy=False)


def cut(vectors: np.ndarray, dimensions: int | None, unit: bool) -> np.ndarray:
    """The first `dimensions` numbers of each vector (Matryoshka), made unit length again when `unit`."""
    if dimensions is None:
        return vectors
    vectors = vectors[:, :dimensions]
    if unit:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors


def openai_vector(values: np.ndarray, encoding_format: str) -> list[float] | str:
    """One vector as OpenAI's API returns it: numbers, or the base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(values.astype("<f4").tobytes()).decode("ascii")
    return values.tolist()


def tokens(tokenized: Tokenized) -> int:
    return sum(len(row) for row in tokenized.rows)


@router.post("/v1/embed", response_model=EmbedResponse, responses=ERRORS)
async def embed(body: EmbedRequest, request: Request) -> Response:
    """Embed texts or token id rows with an encoder model, through its own pipeline unless overridden."""
    worker, recorder = resolve(request, "embed", body.model, ENCODERS)
    check_embeds(worker)
    param = exactly_one(body.texts, body.token_ids, "texts", "token_ids")
    items: Any = body.texts if body.texts is not None else body.token_ids or []
    prompt = chosen_prompt(worker, body.prompt, body.prompt_name, body.texts is not None)
    tokenized = await embedding_rows(request, worker, items, param, prompt, body.truncate)
    vectors = await embed_vectors(request, worker, tokenized, body.pooling, own_normalize(worker, body.normalize))
    return json_response(EmbedResponse(model=recorder.model, embeddings=vectors.tolist(),
                                       usage=usage(tokens(tokenized))), recorder)


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=ERRORS)
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """OpenAI's embeddings endpoint: the model's own vectors (unit length for a checkpoint without a
    sentence-transformers pipeline), as numbers or as base64 (what the official client asks for by
    default), cut to `dimensions` and made unit length again where asked."""
    worker, recorder = resolve(request, "embeddings", body.model, ENCODERS)
    check_embeds(worker)
    check_dimensions(body.dimensions, worker.info.width)
    if body.user is not None:
        log.info("embeddings for user %r on model %s", body.user, worker.info.name)
    items: Any = body.input
    if isinstance(items, str) or (items and isinstance(items[0], int)):
        items = [items]  # one text, or one row of token ids
    prompt = chosen_prompt(worker, None, body.prompt_name, bool(items) and isinstance(items[0], str))
    tokenized = await embedding_rows(request, worker, items, "input", prompt, body.truncate)
    vectors = await embed_vectors(request, worker, tokenized, None, own_normalize(worker, None))
    check_dimensions(body.dimensions, vectors.shape[1])
    data = [EmbeddingData(index=i, embedding=openai_vector(vector, body.encoding_format))
            for i, vector in enumerate(cut(vectors, body.dimensions, True))]
    return json_response(EmbeddingsResponse(data=data, model=recorder.model, usage=usage(tokens(tokenized))),
                         recorder)
