"""hotrod's task routes over encoder heads: /v1/classify, and /v1/rerank in Cohere's shape (Jina's too),
which LangChain's and LlamaIndex's Cohere rerankers call.

Each answer is `hotrod.pipelines`' own, so a route answers what the Python API answers; the model's
forward runs in the engine's dynamic batches (`rows.py`), a 100-document rerank as one submission that
shares its batch with other requests' rows. text-embeddings-inference's routes are in `tei.py`.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response

from hotrod.pipelines import classify
from hotrod.pipelines import rerank as rerank_pipeline
from hotrod.serve import rows
from hotrod.serve.endpoints import ERRORS, usage
from hotrod.serve.head_schemas import (
    ClassifyRequest,
    ClassifyResponse,
    Document,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from hotrod.serve.http_errors import Recorder
from hotrod.tasks import CLASSIFY

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
    scores, tokens = await relevance(request, engine, body.query, texts, None, body.truncate)
    order = ranked(scores)[: body.top_n]
    results = [RerankResult(index=i, relevance_score=scores[i],
                            document=Document(text=texts[i]) if body.return_documents else None) for i in order]
    return json_response(RerankResponse(id=str(uuid.uuid4()), model=recorder.model, results=results,
                                        usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens)), recorder)


async def relevance(request: Request, engine: Any, query: str, texts: list[str], function: str | None,
                    truncate: bool, param: str = "documents") -> tuple[list[float], int]:
    """Each (query, text) pair's score through `function` (None: the cross-encoder's own activation, as
    `model.rerank` scores), and the tokens they ran: the one-label classification of each pair."""
    if function is None:
        function = rerank_pipeline.activation(engine.pipeline_model().config)
    pairs = [[query, text] for text in texts]
    prepared = await rows.prepare(request, engine, classify.prepare, pairs, None, function, truncate, param=param)
    answers = await rows.answer(request, engine, classify, prepared, param)
    return [labels[0]["score"] for labels in answers], rows.tokens(prepared)


def ranked(scores: list[float]) -> list[int]:
    """Indexes by score, best first; equal scores keep the documents' order."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])
