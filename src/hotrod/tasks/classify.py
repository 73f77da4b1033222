"""text-classification: sequence classification, regression and cross-encoders, as transformers'
`pipeline("text-classification")` answers (`hotrod.pipelines.classify`)."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.errors import HotrodError
from hotrod.pipelines import classify
from hotrod.tasks.constants import CLASSIFY
from hotrod.tasks.registry import Bench, Command, Door, Output, Route, TaskSpec, register
from hotrod.verification.measures import LABELS


class PooledClassifier(nn.Module):
    """BERT's: `pooler` (dense + tanh on [CLS]), then `classifier`."""

    def __init__(self, config):
        super().__init__()
        self.pooler = _Pooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden, attention_mask):
        return self.classifier(self.pooler(hidden[:, 0]))


class _Pooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN["tanh"]

    def forward(self, first):
        return self.act(self.dense(first))


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--pair", action="append", metavar="TEXT", help="the second text of a pair, once per TEXT")
    p.add_argument("--top-k", type=_top, default=classify.NOT_GIVEN,
                   help="labels per input, best first; all: every label (default: the best label of each)")
    p.add_argument("--function", default=None, choices=classify.FUNCTIONS,
                   help="applied to the logits (default: the pipeline's choice for the head)")


def _top(value: str) -> int | None:
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or all, got {value!r}") from None


def _call(model: Any, args: argparse.Namespace) -> Any:
    if args.pair is not None and len(args.pair) != len(args.texts):
        raise HotrodError(f"--pair was given {len(args.pair)} times for {len(args.texts)} texts; give one per text")
    inputs = list(zip(args.texts, args.pair)) if args.pair else list(args.texts)
    return model.classify(inputs, top_k=args.top_k, function_to_apply=args.function, truncate=args.truncate)


def _show(args: argparse.Namespace, results: Any):
    for text, result in zip(args.texts, results):
        labels = result if isinstance(result, list) else [result]
        yield "  ".join(f"{r['label']} {r['score']:.4f}" for r in labels) + f"\t{text}"


def rank_agreement(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Share of rows that land at the same rank: what a ranking's user sees of a score difference."""
    return float((ours.float().flatten().argsort(descending=True)
                  == theirs.float().flatten().argsort(descending=True)).float().mean())


def _schemas() -> tuple[type, type]:
    from hotrod.serve.task_schemas import ClassifyRequest, ClassifyResponse

    return ClassifyRequest, ClassifyResponse


def _door(body: Any) -> Door:
    items = [body.input] if isinstance(body.input, str) else body.input
    texts = [(f"input[{i}]" + (f"[{j}]" if isinstance(item, list) else ""), text)
             for i, item in enumerate(items) for j, text in enumerate([item] if isinstance(item, str) else item)]
    return Door("input", len(items), texts, body.truncate)


def _arguments_of(body: Any) -> tuple:
    top_k = classify.NOT_GIVEN if body.top_k == 1 else body.top_k  # the route's 1: one best label per input
    return body.input, top_k, "none" if body.raw_scores else None, body.truncate


def _respond(body: Any, results: Any, reply: Any) -> Any:
    from hotrod.serve.task_schemas import ClassifyResponse

    return ClassifyResponse(model=reply.model, results=results, usage=reply.usage)


SPEC = register(TaskSpec(
    CLASSIFY, kinds=("encoder",), heads=("ForSequenceClassification",),
    outputs=(Output("logits", ("batch", "labels")),), head=PooledClassifier, labelled=True,
    method="classify", pipeline=classify, measure=LABELS,
    command=Command("classify", "labels of texts (or text pairs) from a text-classification model", _arguments,
                    _call, _show),
    route=Route("/v1/classify", "classify", _schemas, _door, _arguments_of, _respond),
    bench=Bench("AutoModelForSequenceClassification", lambda out, mask: out.logits.float(),
                lambda ours, theirs, mask: rank_agreement(ours, theirs)),
    summary="labels and scores of texts or text pairs",
))
