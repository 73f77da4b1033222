"""text-embeddings-inference's embedding routes: /embed, /embed_all, /similarity, /tokenize, /decode, and POST /
(which TEI answers as its served model's main route), with TEI's request and response shapes, so a TEI client
(`huggingface_hub.InferenceClient.feature_extraction`, LangChain's and LlamaIndex's TEI embeddings) switches
to hotrod unchanged. The vectors are the model's own, as /v1/embeddings gives them (`embeddings.py`).

TEI serves one model, so these routes name none: they use the one served encoder that has embeddings.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from fastapi import APIRouter, Body, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from hotrod import tasks
from hotrod.errors import HotrodError
from hotrod.pipelines.sentence_tokens import sentence_tokenizer
from hotrod.serve import task_routes, tei
from hotrod.serve.checks import check_bytes, check_token_count, input_limit
from hotrod.serve.embeddings import chosen_prompt, cut, embed_vectors, embedding_rows
from hotrod.serve.endpoints import ENCODERS, TEI_ERRORS, json_response
from hotrod.serve.http_errors import ApiError, Recorder, resolve
from hotrod.serve.messages import Worker
from hotrod.serve.schemas import (
    TeiDecodeRequest,
    TeiEmbedAllRequest,
    TeiEmbedRequest,
    TeiSimilarities,
    TeiSimilarityParameters,
    TeiSimilarityRequest,
    TeiTexts,
    TeiToken,
    TeiTokenizeRequest,
    TeiTokens,
    TeiTokenVectors,
    TeiVectors,
)
from hotrod.serve.sse import collect, submit
from hotrod.serve.task_calls import on_tokenizer
from hotrod.serve.task_schemas import PredictRequest, TeiRerankRequest
from hotrod.tasks.constants import RERANK, SPARSE

router = APIRouter()


def served_embedder(request: Request, endpoint: str) -> tuple[Worker, Recorder]:
    """The one served encoder with embeddings, as TEI serves one model."""
    workers = request.app.state.workers
    fits = [name for name, worker in workers.items() if _embeds(worker)]
    if not fits:
        served = ", ".join(f"{name} ({worker.info.task or worker.info.kind})" for name, worker in workers.items())
        raise ApiError(400, f"{request.url.path} needs an encoder with embeddings; this server serves {served}")
    if len(fits) > 1:
        raise ApiError(400, f"{request.url.path} serves one model, and several embed ({', '.join(fits)}); name one "
                            f"with /v1/embeddings")
    return resolve(request, endpoint, fits[0], ENCODERS)


def _embeds(worker: Worker) -> bool:
    return worker.info.kind in ENCODERS and (worker.info.task is None or tasks.get(worker.info.task).embeds)


def _items(inputs: Any) -> list[Any]:
    """TEI's `inputs` as a list of inputs: one text or one row of ids is one input."""
    return [inputs] if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else list(inputs)


async def _rows(request: Request, worker: Worker, body: TeiEmbedAllRequest) -> Any:
    items = _items(body.inputs)
    prompt = chosen_prompt(worker, None, body.prompt_name, bool(items) and isinstance(items[0], str))
    return await embedding_rows(request, worker, items, "inputs", prompt, body.truncate,
                                body.truncation_direction.lower())


@router.post("/embed", response_model=TeiVectors, responses=TEI_ERRORS)
async def embed(body: TeiEmbedRequest, request: Request) -> Response:
    """One vector per input (TEI's /embed): the model's own pooling, Dense and normalization."""
    worker, recorder = served_embedder(request, "tei_embed")
    tokenized = await _rows(request, worker, body)
    vectors = await embed_vectors(request, worker, tokenized, None, body.normalize)
    if body.dimensions is not None and body.dimensions > vectors.shape[1]:
        raise ApiError(400, f"dimensions: {body.dimensions} is more than the {vectors.shape[1]} numbers of this "
                            f"model's vectors", "dimensions")
    return json_response(TeiVectors(cut(vectors, body.dimensions, body.normalize).tolist()), recorder)


@router.post("/embed_all", response_model=TeiTokenVectors, responses=TEI_ERRORS)
async def embed_all(body: TeiEmbedAllRequest, request: Request) -> Response:
    """Every token's vector of the last hidden state, per input (TEI's /embed_all)."""
    worker, recorder = served_embedder(request, "tei_embed_all")
    tokenized = await _rows(request, worker, body)
    _, last = await collect(submit(request, lambda: worker.submit_hidden(tokenized.rows)))
    states = last.result if last.result is not None else []
    if len(states) != len(tokenized.rows):
        raise ApiError(500, f"the model returned {len(states)} rows of vectors for {len(tokenized.rows)} inputs")
    return json_response(TeiTokenVectors([state.float().tolist() for state in states]), recorder)


@router.post("/similarity", response_model=TeiSimilarities, responses=TEI_ERRORS)
async def similarity(body: TeiSimilarityRequest, request: Request) -> Response:
    """The cosine similarity of the source sentence's vector with each sentence's (TEI's /similarity)."""
    worker, recorder = served_embedder(request, "tei_similarity")
    options = body.parameters or TeiSimilarityParameters()
    if not body.inputs.sentences:
        raise ApiError(400, "inputs.sentences: the list is empty", "inputs")
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    wheres = ["inputs.source_sentence", *(f"inputs.sentences[{i}]" for i in range(len(body.inputs.sentences)))]
    prompt = chosen_prompt(worker, None, options.prompt_name, True)
    tokenized = await embedding_rows(request, worker, texts, "inputs", prompt, options.truncate,
                                     options.truncation_direction.lower(), wheres)
    vectors = torch.from_numpy(await embed_vectors(request, worker, tokenized, None, None))
    scores = torch.nn.functional.cosine_similarity(vectors[:1], vectors[1:])
    return json_response(TeiSimilarities(scores.tolist()), recorder)


@router.post("/tokenize", response_model=TeiTokens, responses=TEI_ERRORS)
async def tokenize(body: TeiTokenizeRequest, request: Request) -> Response:
    """Each text's tokens with their characters (TEI's /tokenize), as the model's embedding pipeline makes
    them, its prompt included."""
    worker, recorder = _tokenizing(request, "tei_tokenize")
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    if not texts:
        raise ApiError(400, "inputs: the list is empty", "inputs")
    most = request.app.state.limits.max_batch_inputs
    if len(texts) > most:
        raise ApiError(400, f"inputs: {len(texts)} inputs; this server takes at most {most} per request", "inputs")
    limit = input_limit(request, worker)  # the limits every route's texts meet, before the tokenizer runs
    wheres = ["inputs"] if isinstance(body.inputs, str) else [f"inputs[{i}]" for i in range(len(texts))]
    for text, where in zip(texts, wheres):
        check_bytes(text, limit, where, "inputs")
    prompt = chosen_prompt(worker, None, body.prompt_name, True) or ""
    tokens = await on_tokenizer(request, worker, _tokens, [prompt + text for text in texts], body.add_special_tokens,
                                param="inputs")
    for row, where in zip(tokens, wheres):
        check_token_count(len(row), limit, where, "inputs")
    return json_response(TeiTokens(tokens), recorder)


@router.post("/decode", response_model=TeiTexts, responses=TEI_ERRORS)
async def decode(body: TeiDecodeRequest, request: Request) -> Response:
    """The text of each row of token ids (TEI's /decode), special tokens left out unless asked for."""
    worker, recorder = _tokenizing(request, "tei_decode")
    single = not body.ids or isinstance(body.ids[0], int)
    rows: list[list[int]] = [body.ids] if single else body.ids  # type: ignore[list-item]
    most = request.app.state.limits.max_batch_inputs
    if len(rows) > most:
        raise ApiError(400, f"ids: {len(rows)} rows; this server takes at most {most} per request", "ids")
    limit, vocab = input_limit(request, worker), worker.info.vocab_size
    for i, row in enumerate(rows):
        where = "ids" if single else f"ids[{i}]"
        check_token_count(len(row), limit, where, "ids")
        bad = next((token for token in row if not 0 <= token < vocab), None)
        if bad is not None:
            raise ApiError(400, f"{where}: token id {bad} is outside the vocabulary [0, {vocab})", "ids")
    texts = await on_tokenizer(request, worker, _texts, rows, body.skip_special_tokens, param="ids")
    return json_response(TeiTexts(texts), recorder)


def _tokenizing(request: Request, endpoint: str) -> tuple[Worker, Recorder]:
    """The model whose tokenizer /tokenize and /decode use: the one served, as TEI tokenizes for any model it
    serves; among several, the one that embeds."""
    if len(request.app.state.workers) == 1:
        return resolve(request, endpoint, None, ENCODERS)
    return served_embedder(request, endpoint)


def _texts(model: Any, rows: list[list[int]], skip_special: bool) -> list[str]:
    if model.tokenizer is None:
        raise HotrodError("this model has no tokenizer")
    return [model.tokenizer.decode(row, skip_special_tokens=skip_special) for row in rows]


def _tokens(model: Any, texts: list[str], special: bool) -> list[list[TeiToken]]:
    """Each text's tokens as TEI gives them: a special token (the tokenizer's special-tokens mask) by its own name
    and no offsets, another by the text it covers and that text's UTF-8 byte offsets (TEI's `start` and `stop`
    count bytes; a fast tokenizer's offsets here count characters, so they are turned into bytes)."""
    if model.tokenizer is None:
        raise HotrodError("this model has no tokenizer")
    tokenizer = sentence_tokenizer(model)  # the embedding pipeline's (lowercasing where the checkpoint says)
    if not getattr(tokenizer, "is_fast", False):
        raise HotrodError("this model's tokenizer is not a fast one, so it cannot say which characters a token covers")
    encoded = tokenizer(texts, add_special_tokens=special, return_offsets_mapping=True, return_special_tokens_mask=True)
    result = []
    for text, ids, offsets, mask in zip(texts, encoded["input_ids"], encoded["offset_mapping"],
                                        encoded["special_tokens_mask"]):
        names = tokenizer.convert_ids_to_tokens(ids)
        at = _byte_offsets(text)
        result.append([TeiToken(id=i, text=name, special=True, start=None, stop=None) if marked else
                       TeiToken(id=i, text=text[start:stop], special=False, start=at[start], stop=at[stop])
                       for i, name, (start, stop), marked in zip(ids, names, offsets, mask)])
    return result


def _byte_offsets(text: str) -> list[int]:
    """The UTF-8 byte offset of each character index of `text`, its length included (index len(text))."""
    return list(itertools.accumulate((len(c.encode("utf-8", "surrogatepass")) for c in text), initial=0))


@router.post("/", responses=TEI_ERRORS)
async def root(request: Request, body: dict[str, Any] = Body(...)) -> Response:  # noqa: B008 (FastAPI's idiom)
    """TEI's main route: the served model's own (/embed for an embedding model, /embed_sparse for a SPLADE
    one, /rerank for a reranker given a query, /predict for a classifier)."""
    workers = request.app.state.workers
    if any(_embeds(worker) for worker in workers.values()):
        return await embed(_validated(TeiEmbedRequest, body), request)
    sparse = tasks.get(SPARSE)
    if any(worker.info.task == SPARSE for worker in workers.values()):
        return await task_routes.answer(sparse, _validated(sparse.route.schemas()[0], body), request)
    rerankers = tasks.get(RERANK)
    if "query" in body and any(rerankers.refusal(w.info.task, len(w.info.labels), names=w.info.labels) is None
                                 for w in workers.values()):
        return await tei.rerank(_validated(TeiRerankRequest, body), request)
    return await tei.predict(_validated(PredictRequest, body), request)


def _validated(schema: type[BaseModel], body: dict[str, Any]) -> Any:
    """`body` as `schema`, refused as FastAPI refuses a body (422 naming the field)."""
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]) from None
