"""hotrod's task routes over encoder heads: /v1/classify, /v1/tag, /v1/answer, and /v1/rerank in Cohere's shape (Jina's too),
which LangChain's and LlamaIndex's Cohere rerankers call.

Each answer is `hotrod.pipelines`' own, so a route answers what the Python API answers; the model's
forward runs in the engine's dynamic batches (`rows.py`), a 100-document rerank as one submission that
shares its batch with other requests' rows. text-embeddings-inference's routes are in `tei.py`.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response

from hotrod.errors import HotrodError
from hotrod.pipelines import answer as answer_pipeline
from hotrod.pipelines import classify
from hotrod.pipelines import rerank as rerank_pipeline
from hotrod.pipelines import tag as tag_pipeline
from hotrod.serve import rows
from hotrod.serve.endpoints import ERRORS, usage
from hotrod.serve.head_schemas import (
    AnswerRequest,
    AnswerResponse,
    ClassifyRequest,
    ClassifyResponse,
    Document,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    TagRequest,
    TagResponse,
)
from hotrod.serve.http_errors import ApiError, Recorder
from hotrod.tasks import ANSWER, CLASSIFY, TOKENS

router = APIRouter()


def json_response(body: Any, recorder: Recorder) -> Response:
    """The body without its unset optional fields (a rerank result's document only when asked for)."""
    recorder.done("ok")
    return Response(body.model_dump_json(exclude_none=True), media_type="application/json")


@router.post("/v1/classify", response_model=ClassifyResponse, responses=ERRORS)
async def classify_route(body: ClassifyRequest, request: Request) -> Response:
    """Labels and scores of texts or text pairs, as transformers' text-classification pipeline answers."""
    engine, recorder = rows.head_engine(request, "classify", body.model, CLASSIFY)
    items = [body.input] if isinstance(body.input, str) else body.input
    rows.check_count(request, len(items), "input")
    texts = [(f"input[{i}]" + (f"[{j}]" if isinstance(item, list) else ""), text)
             for i, item in enumerate(items) for j, text in enumerate([item] if isinstance(item, str) else item)]
    rows.check_texts(request, engine, texts, "input", body.truncate)
    function = "none" if body.raw_scores else None  # None: the pipeline's own choice for this head
    prepared = await rows.prepare(request, engine, classify.prepare, body.input, body.top_k, function, body.truncate,
                                  param="input")
    results = await rows.answer(request, engine, classify, prepared, "input")
    return json_response(ClassifyResponse(model=recorder.model, results=results,
                                          usage=usage(rows.tokens(prepared))), recorder)


@router.post("/v1/rerank", response_model=RerankResponse, responses=ERRORS)
async def rerank_route(body: RerankRequest, request: Request) -> Response:
    """Documents by relevance to the query (Cohere's v1 rerank): a cross-encoder's score of each pair."""
    engine, recorder = rows.head_engine(request, "rerank", body.model, CLASSIFY)
    rows.check_one_label(engine)
    texts = [doc if isinstance(doc, str) else doc.text for doc in body.documents]
    rows.check_count(request, len(texts), "documents", rows.MAX_DOCUMENTS)
    rows.check_texts(request, engine, [("query", body.query)], "query", body.truncate)
    rows.check_texts(request, engine, [(f"documents[{i}]", text) for i, text in enumerate(texts)], "documents",
                     body.truncate)
    ranking, tokens = await relevance(request, engine, body.query, texts, None, body.truncate, top_n=body.top_n)
    results = [RerankResult(index=r["index"], relevance_score=r["score"],
                            document=Document(text=texts[r["index"]]) if body.return_documents else None)
               for r in ranking]
    return json_response(RerankResponse(id=str(uuid.uuid4()), model=recorder.model, results=results,
                                        usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens)), recorder)


async def relevance(request: Request, engine: Any, query: str, texts: list[str], function: str | None,
                    truncate: bool, param: str = "documents", top_n: int | None = None) -> tuple[list[dict], int]:
    """`model.rerank`'s ranking of the texts ([{"index", "score"}], best first, the first `top_n`), each
    score through `function` (None: the cross-encoder's own activation), and the tokens they ran."""
    prepared = await rows.prepare(request, engine, rerank_pipeline.prepare, query, texts, top_n, truncate, function,
                                  param=param)
    return await rows.answer(request, engine, rerank_pipeline, prepared, param), rows.tokens(prepared)


@router.post("/v1/tag", response_model=TagResponse, responses=ERRORS)
async def tag_route(body: TagRequest, request: Request) -> Response:
    """Entities of texts, as transformers' token-classification pipeline finds them."""
    engine, recorder = rows.head_engine(request, "tag", body.model, TOKENS)
    items = [body.input] if isinstance(body.input, str) else body.input
    rows.check_count(request, len(items), "input")
    rows.check_texts(request, engine, [(f"input[{i}]", text) for i, text in enumerate(items)], "input", body.truncate)
    prepared = await rows.prepare(request, engine, tag_pipeline.prepare, items, body.aggregation_strategy,
                                  body.ignore_labels, body.truncate, param="input")
    results = await rows.answer(request, engine, tag_pipeline, prepared, "input")
    return json_response(TagResponse(model=recorder.model, results=results, usage=usage(rows.tokens(prepared))),
                         recorder)


# A context's characters per token of a window at most: bounds a context before it is tokenized.
_CHARACTERS_PER_TOKEN = 16


@router.post("/v1/answer", response_model=AnswerResponse, responses=ERRORS)
async def answer_route(body: AnswerRequest, request: Request) -> Response:
    """The span of the context that answers the question; every window of a long context runs as rows of
    one submission, batched with other requests'."""
    engine, recorder = rows.head_engine(request, "answer", body.model, ANSWER)
    rows.check_texts(request, engine, [("question", body.question)], "question", False)
    rows.check_texts(request, engine, [("context", body.context)], "context", True)
    windows = request.app.state.limits.max_batch_inputs
    if len(body.context) > windows * 384 * _CHARACTERS_PER_TOKEN:
        raise ApiError(400, f"context: {len(body.context)} characters is more than the {windows} windows this "
                            "server runs per request (--max-batch-inputs) can hold", "context")
    prepared = await rows.on_tokenizer(request, engine, _windows, body, param="context")
    if len(prepared.rows) > windows:
        raise ApiError(400, f"context: it makes {len(prepared.rows)} windows; this server runs at most {windows} "
                            "per request (--max-batch-inputs): shorten it or raise doc_stride", "context")
    found = await rows.answer(request, engine, answer_pipeline, prepared, "context")
    return json_response(AnswerResponse(model=recorder.model, answers=found if isinstance(found, list) else [found],
                                        windows=len(prepared.rows), usage=usage(rows.tokens(prepared))), recorder)


def _windows(model: Any, body: AnswerRequest) -> Any:
    """The question's windows (`hotrod.pipelines.answer.prepare`); a refusal names the field it is about."""
    try:
        return answer_pipeline.prepare(model, body.question, body.context, body.top_k, body.doc_stride,
                                       body.max_answer_len, body.max_seq_len, body.max_question_len,
                                       body.handle_impossible_answer, body.align_to_words)
    except HotrodError as exc:
        message = str(exc)
        field = next((f for f in ("question", "doc_stride", "max_seq_len") if message.startswith(("the " + f, f))),
                     "context")
        raise ApiError(400, f"{field}: {message}", field) from None
