"""token-classification: NER and POS, entities as transformers' `pipeline("token-classification")` groups
them (`hotrod.pipelines.tag`)."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from hotrod.pipelines import tag
from hotrod.tasks.constants import TOKENS
from hotrod.tasks.registry import Bench, Command, Door, Output, Route, TaskSpec, register
from hotrod.verification.measures import ENTITIES


class TokenClassifier(nn.Module):
    """`classifier` on every token."""

    def __init__(self, config):
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden, attention_mask):
        return self.classifier(hidden)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--aggregation", default="simple", choices=tag.STRATEGIES)


def _call(model: Any, args: argparse.Namespace) -> Any:
    return model.tag(list(args.texts), aggregation_strategy=args.aggregation, truncate=args.truncate)


def _show(args: argparse.Namespace, results: Any):
    for text, entities in zip(args.texts, results):
        yield text
        for e in entities:
            label = e.get("entity_group") or e.get("entity")
            if e["start"] is None:  # a slow tokenizer: no characters, the tokens' own text
                yield f"  {label:<10} {e['score']:.4f}  -  {e['word']}"
            else:
                yield f"  {label:<10} {e['score']:.4f}  {e['start']}-{e['end']}  {text[e['start']:e['end']]}"


def label_agreement(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of real tokens given the same label (the best logit): what a tagger's user sees of a logit
    difference. Padding is no one's answer, so it is left out."""
    real = mask.bool()
    return float((ours.argmax(dim=-1)[real] == theirs.argmax(dim=-1)[real]).float().mean())


def _schemas() -> tuple[type, type]:
    from hotrod.serve.task_schemas import TagRequest, TagResponse

    return TagRequest, TagResponse


def _door(body: Any) -> Door:
    items = [body.input] if isinstance(body.input, str) else body.input
    return Door("input", len(items), [(f"input[{i}]", text) for i, text in enumerate(items)], body.truncate)


def _arguments_of(body: Any) -> tuple:
    items = [body.input] if isinstance(body.input, str) else body.input
    return items, body.aggregation_strategy, body.ignore_labels, body.truncate


def _respond(body: Any, results: Any, reply: Any) -> Any:
    from hotrod.serve.task_schemas import TagResponse

    return TagResponse(model=reply.model, results=results, usage=reply.usage)


SPEC = register(TaskSpec(
    TOKENS, kinds=("encoder",), heads=("ForTokenClassification",),
    outputs=(Output("logits", ("batch", "sequence", "labels")),), head=TokenClassifier, labelled=True,
    method="tag", pipeline=tag, measure=ENTITIES,
    command=Command("tag", "entities of texts from a token-classification (NER) model", _arguments, _call, _show),
    route=Route("/v1/tag", "tag", _schemas, _door, _arguments_of, _respond),
    bench=Bench("AutoModelForTokenClassification", lambda out, mask: out.logits.float(), label_agreement),
    summary="entities of texts",
))
