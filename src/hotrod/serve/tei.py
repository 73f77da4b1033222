"""text-embeddings-inference's /predict, /rerank and /info, with its request and response shapes, so that a
TEI client (huggingface_hub's, LangChain's and LlamaIndex's TEI rerankers; `InferenceClient.get_endpoint_info`)
switches to hotrod unchanged.

TEI serves one model, so these routes name none: they use the one served model of the task (a
text-classification head; for /rerank, one with a single label). Scores are TEI's: without `raw_scores`, a
sigmoid for a one-label head and a softmax otherwise, every label listed, best first.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from hotrod import tasks, version
from hotrod.pipelines import classify, sentence_tokens
from hotrod.pipelines import rerank as rerank_pipeline
from hotrod.pipelines.base import Prepared
from hotrod.serve import task_calls
from hotrod.serve.endpoints import ENCODERS, TEI_ERRORS
from hotrod.serve.http_errors import ApiError, resolve
from hotrod.serve.messages import ModelInfo, Worker
from hotrod.serve.schemas import TeiInfo
from hotrod.serve.task_routes import json_response
from hotrod.serve.task_schemas import (
    Prediction,
    PredictParameters,
    PredictRequest,
    PredictResponse,
    Rank,
    TeiRerankRequest,
    TeiRerankResponse,
)
from hotrod.tasks.constants import CLASSIFY, RERANK
from hotrod.tasks.rerank import MAX_DOCUMENTS

router = APIRouter()
_NAMED = {"predict": "/v1/classify", "rerank": "/v1/rerank"}  # the route of each that names its model
Item = str | list[str]  # one text, or a [text, text_pair]


def served_head(request: Request, endpoint: str, task: str) -> tuple[Worker, Any]:
    """The one served model that `task` (classification, or its reranking variant) runs on, as TEI serves one."""
    name = task_calls.one_served(request, tasks.get(task), f"name one with {_NAMED[endpoint]}")
    return resolve(request, endpoint if endpoint == "predict" else "tei_rerank", name, ENCODERS)


def predict_items(inputs: str | list[str] | list[list[str]]) -> tuple[list[Item], bool]:
    """TEI's reading of `inputs`: (the inputs, whether it was one). A string or a list of one or two strings
    is one input; a list of lists is a batch of [text] and [text, text_pair]."""
    if isinstance(inputs, str):
        return [inputs], True
    if not inputs:
        raise ApiError(400, "inputs: the list is empty", "inputs")
    if isinstance(inputs[0], str):
        if len(inputs) > 2:
            raise ApiError(400, f"inputs: a list of strings is one input, [text] or [text, text_pair]; got "
                                f"{len(inputs)} strings (a batch is a list of lists)", "inputs")
        return [inputs[0] if len(inputs) == 1 else list(inputs)], True  # type: ignore[list-item]
    items: list[Item] = []
    for i, item in enumerate(inputs):
        if len(item) not in (1, 2):
            raise ApiError(400, f"inputs[{i}]: {len(item)} texts; an input is [text] or [text, text_pair]", "inputs")
        items.append(item[0] if len(item) == 1 else list(item))
    return items, False


def check_direction(direction: str) -> None:
    """TEI's truncation_direction on the pair routes: right, as transformers cuts pairs; left, refused by name."""
    if direction.lower() != "right":
        raise ApiError(400, f"truncation_direction: {direction} is not supported here; texts and pairs are cut on "
                            "the right", "truncation_direction")


def tei_function(worker: Worker, raw_scores: bool) -> str:
    if raw_scores:
        return "none"
    return "sigmoid" if len(worker.info.labels) == 1 else "softmax"


@router.post("/predict", response_model=PredictResponse, responses=TEI_ERRORS)
async def predict(body: PredictRequest, request: Request) -> Response:
    """Every label's score of each input, best first (TEI's /predict)."""
    worker, recorder = served_head(request, "predict", CLASSIFY)
    check_direction(body.truncation_direction)
    items, single = predict_items(body.inputs)
    task_calls.check_count(request, len(items), "inputs")
    texts = [(f"inputs[{i}]" if isinstance(item, str) else f"inputs[{i}][{j}]", text)
             for i, item in enumerate(items) for j, text in enumerate([item] if isinstance(item, str) else item)]
    task_calls.check_texts(request, worker, texts, "inputs", body.truncate)
    options = body.parameters or PredictParameters()
    function = tei_function(worker, body.raw_scores)
    if options.function_to_apply is not None:
        if body.raw_scores and options.function_to_apply != "none":
            raise ApiError(400, f"parameters.function_to_apply: {options.function_to_apply} with raw_scores: true; "
                                "give one", "parameters")
        function = options.function_to_apply
    prepared = await _prepare_mixed(request, worker, items, function, body.truncate)
    answers = await task_calls.answer(request, worker, classify, prepared, "inputs")
    predictions = [[Prediction(**label) for label in labels[:options.top_k]] for labels in answers]
    # A body with `parameters` is the Inference API's (huggingface_hub's text_classification), answered as that
    # API answers: a list per input, one input too.
    flat = single and body.parameters is None
    return json_response(PredictResponse(predictions[0] if flat else predictions), recorder)


async def _prepare_mixed(request: Request, worker: Worker, items: list[Item], function: str,
                         truncate: bool) -> Prepared:
    """The rows of every input, in order: classify's prepare takes texts or pairs, and a TEI batch may hold
    both, so a mixed batch is prepared input by input (every label of each, through `function`)."""
    parts = [items] if len({isinstance(item, str) for item in items}) == 1 else [[item] for item in items]
    prepared = [await task_calls.prepare(request, worker, classify.prepare, part, None, function, truncate,
                                         param="inputs") for part in parts]
    return Prepared([row for part in prepared for row in part.rows], state=False, options=prepared[0].options)


@router.post("/rerank", response_model=TeiRerankResponse, responses=TEI_ERRORS)
async def rerank(body: TeiRerankRequest, request: Request) -> Response:
    """The texts by relevance to the query, best first (TEI's /rerank)."""
    worker, recorder = served_head(request, "rerank", RERANK)
    check_direction(body.truncation_direction)
    task_calls.check_count(request, len(body.texts), "texts", MAX_DOCUMENTS)
    task_calls.check_texts(request, worker, [("query", body.query)], "query", body.truncate)
    task_calls.check_texts(request, worker, [(f"texts[{i}]", text) for i, text in enumerate(body.texts)], "texts",
                           body.truncate)
    prepared = await task_calls.prepare(request, worker, rerank_pipeline.prepare, body.query, body.texts, None,
                                        body.truncate, tei_function(worker, body.raw_scores), param="texts")
    ranking = await task_calls.answer(request, worker, rerank_pipeline, prepared, "texts")
    ranks = [Rank(index=r["index"], text=body.texts[r["index"]] if body.return_text else None, score=r["score"])
             for r in ranking]
    return json_response(TeiRerankResponse(ranks), recorder)


@router.get("/info", response_model=TeiInfo, responses=TEI_ERRORS)
async def info(request: Request) -> TeiInfo:
    """The served model TEI would serve (an embedder, a classifier or a reranker) and this server's limits
    (TEI's /info). With several such models served, a 400 that names them: /v1/models lists each."""
    workers = request.app.state.workers
    fits = [name for name, worker in workers.items() if model_type(worker.info) is not None]
    if len(fits) != 1:
        served = ", ".join(f"{name} ({worker.info.task or worker.info.kind})" for name, worker in workers.items())
        have = "several of them" if fits else "none of them"
        raise ApiError(400, f"/info describes the one embedding, classification or reranking model served, and "
                            f"this server has {have} ({served}); /v1/models lists every model")
    described, limits = workers[fits[0]].info, request.app.state.limits
    longest = limits.input_tokens(described.max_positions)
    if "embedding" in model_type(described):  # a longer text is refused or cut where sentence-transformers cuts
        cut = await task_calls.on_tokenizer(request, workers[fits[0]], sentence_tokens.max_length, param="inputs")
        longest = min(longest, cut or longest)
    rows = described.max_batch_size or None
    return TeiInfo(model_id=described.name, model_dtype=described.precision, model_type=model_type(described),
                   max_concurrent_requests=described.max_queue, max_input_length=longest,
                   max_batch_tokens=(rows or 1) * longest, max_batch_requests=rows,
                   max_client_batch_size=limits.max_batch_inputs, auto_truncate=False, tokenization_workers=1,
                   version=version.__version__)


def model_type(info: ModelInfo) -> dict[str, dict[str, Any]] | None:
    """TEI's model_type of a served model: a text-classification head is a reranker where /rerank runs on it (one
    label), else a classifier; an encoder with embeddings an embedding model with its pooling; None for one TEI
    would not serve (a tagger, a question answerer, a decoder)."""
    if info.kind not in ENCODERS:
        return None
    labels = {"id2label": {str(i): label for i, label in enumerate(info.labels)},
              "label2id": {label: i for i, label in enumerate(info.labels)}}
    for task, name in ((RERANK, "reranker"), (CLASSIFY, "classifier")):  # what /rerank and /predict serve
        if tasks.get(task).refusal(info.task or info.kind, len(info.labels), names=info.labels) is None:
            return {name: labels}
    if info.task is not None and not tasks.get(info.task).embeds:
        return None
    steps = getattr(info.sentence, "steps", None)
    first = steps[0] if steps else None
    pooling = "+".join(first.modes) if hasattr(first, "modes") else getattr(first, "type", "mean")
    return {"embedding": {"pooling": pooling}}
