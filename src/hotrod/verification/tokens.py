"""token-classification heads: entity F1 against the source's entities, and per-token label agreement.

Entities are grouped as `HotrodModel.tag` (transformers' pipeline) groups them with
`aggregation_strategy="simple"` (`hotrod.pipelines.tag.groups`): special tokens and "O" are dropped; an
entity is its (label, start, end) in tokens, which on both sides come from the same tokenization, so a
token span names the same characters the pipeline's `start`/`end` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.pipelines.tag import group_name, groups
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
    labels = [label for _, label in tags]
    found = [(group_name(labels[members[0]]), tags[members[0]][0], tags[members[-1]][0] + 1)
             for members in groups(labels)]
    return [entity for entity in found if entity[0] != "O"]


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
