"""token-classification heads: entity F1 against the source's entities, and per-token label agreement.

Entities are grouped as transformers' pipeline does with `aggregation_strategy="simple"`: special tokens
and "O" are dropped; a token joins the entity before it when it carries the same tag and is not a "B-";
an entity is its (label, start, end) in tokens, which on both sides come from the same tokenization,
so a token span names the same characters the pipeline's `start`/`end` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.verification import metrics
from hotrod.verification.examples import Example
from hotrod.verification.rows import example_rows

Entity = tuple[str, int, int]  # label, first token, one past the last token


def compare_entities(candidate: Any, reference: Any, examples: Sequence[Example]) -> dict:
    rows = example_rows(candidate, examples)
    ours, theirs = candidate.run_rows(rows), reference.run_rows(rows)
    kept = [_ordinary(candidate, row.input_ids) for row in rows]
    our_tags = [_tags(candidate, out["logits"], k) for out, k in zip(ours, kept)]
    their_tags = [_tags(reference, out["logits"], k) for out, k in zip(theirs, kept)]
    agreed = sum(a == b for mine, yours in zip(our_tags, their_tags) for a, b in zip(mine, yours))
    tokens = sum(len(t) for t in their_tags)
    precision, recall, f1 = metrics.entity_f1(map(entities, our_tags), map(entities, their_tags))
    return {"examples": len(rows), "entity_f1": f1, "entity_precision": precision, "entity_recall": recall,
            "source_entities": sum(len(entities(t)) for t in their_tags),
            "token_agreement": agreed / tokens if tokens else 1.0, "score": f1, "score_name": "entity F1"}


def entities(tags: Sequence[tuple[int, str]]) -> list[Entity]:
    """(label, start, end) of each entity in a row's (position, label) tags, grouped as "simple" does."""
    found: list[list] = []
    open_tag = None  # the tag of the entity the last token belongs to; an "O" closes it
    for position, label in tags:
        bi, tag = _split(label)
        if tag is not None and bi != "B" and tag == open_tag:
            found[-1][2] = position + 1
        elif tag is not None:
            found.append([tag, position, position + 1])
        open_tag = tag
    return [tuple(entity) for entity in found]


def _tags(model: Any, logits: torch.Tensor, kept: list[int]) -> list[tuple[int, str]]:
    """(position, label) of each ordinary token's argmax."""
    best = logits.float().argmax(-1).tolist()
    return [(i, model.labels[best[i]]) for i in kept]


def _ordinary(model: Any, ids: list[int]) -> list[int]:
    """Positions of tokens that are not special ([CLS], [SEP], padding): the pipeline never tags them."""
    if model.tokenizer is None:
        return list(range(len(ids)))
    special = model.tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
    return [i for i, s in enumerate(special) if not s]


def _split(label: str) -> tuple[str, str | None]:
    """("B" or "I", entity type), or (_, None) for "O"; a label without a prefix is an "I" of itself."""
    if label == "O":
        return "O", None
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label
