"""Reranking, a variant of text-classification: a cross-encoder's (one-label head's) score of each
(query, document) pair, as sentence-transformers' `CrossEncoder.predict` gives it, documents best first
(`hotrod.pipelines.rerank`). Its route has Cohere's shape (Jina's too)."""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from hotrod.pipelines import rerank
from hotrod.tasks.constants import CLASSIFY, RERANK
from hotrod.tasks.registry import Command, Door, Route, TaskSpec, register
from hotrod.verification.measures import RANKING

MAX_DOCUMENTS = 10_000  # documents per rerank whatever --max-batch-inputs says, as Cohere's API bounds them


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("documents", nargs="+", metavar="DOC")
    p.add_argument("--query", required=True)
    p.add_argument("--top-n", type=int, default=None, help="the best N only")


def _call(model: Any, args: argparse.Namespace) -> Any:
    return model.rerank(args.query, args.documents, top_n=args.top_n, truncate=args.truncate)


def _show(args: argparse.Namespace, ranked: Any):
    for entry in ranked:
        yield f"{entry['score']:.4f}\t[{entry['index']}] {args.documents[entry['index']]}"


def _schemas() -> tuple[type, type]:
    from hotrod.serve.task_schemas import RerankRequest, RerankResponse

    return RerankRequest, RerankResponse


def _texts(body: Any) -> list[str]:
    return [doc if isinstance(doc, str) else doc.text for doc in body.documents]


def _door(body: Any) -> Door:
    texts = _texts(body)
    return Door("documents", len(texts), [(f"documents[{i}]", text) for i, text in enumerate(texts)], body.truncate,
                most=MAX_DOCUMENTS, other=[("query", [("query", body.query)], body.truncate)])


def _arguments_of(body: Any) -> tuple:
    return body.query, _texts(body), body.top_n, body.truncate, None


def _respond(body: Any, ranking: Any, reply: Any) -> Any:
    from hotrod.serve.task_schemas import Document, RerankResponse, RerankResult, RerankUsage

    texts = _texts(body)
    results = [RerankResult(index=r["index"], relevance_score=r["score"],
                            document=Document(text=texts[r["index"]]) if body.return_documents else None)
               for r in ranking]
    return RerankResponse(id=str(uuid.uuid4()), model=reply.model, results=results,
                          usage=RerankUsage(prompt_tokens=reply.tokens, total_tokens=reply.tokens))


SPEC = register(TaskSpec(
    RERANK, kinds=("encoder",), variant_of=CLASSIFY, fits=lambda labels: labels == 1,
    needs="a head with one output, one label (a cross-encoder)", method="rerank", pipeline=rerank,
    measure=RANKING,
    command=Command("rerank", "documents by a cross-encoder's relevance to a query, best first", _arguments, _call,
                    _show),
    route=Route("/v1/rerank", "rerank", _schemas, _door, _arguments_of, _respond),
    summary="documents by relevance to a query",
))
