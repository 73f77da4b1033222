"""text-classification heads: labels (argmax agreement) or, for one-output heads, rankings.

Scores are what transformers' pipeline reports (`hotrod.pipelines.classify`: softmax, sigmoid or none as
the config asks), so `score_mean_abs` is the difference a user of `classify` or `rerank` would see.
A one-output head is a cross-encoder (or a regressor): what matters is the order it puts documents in,
measured per query by `metrics.order_agreement` (pooled pairwise agreement) and `metrics.top1_agreement`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.pipelines.classify import apply, default_function
from hotrod.verification import metrics
from hotrod.verification.examples import Example
from hotrod.verification.rows import example_rows


def compare_labels(candidate: Any, reference: Any, examples: Sequence[Example]) -> dict:
    """Label agreement with the source, and accuracy of both on the examples' labels where given."""
    rows = example_rows(candidate, examples)
    ours, theirs = pipeline_scores(candidate, rows), pipeline_scores(reference, rows)
    agreement = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    figures = {"examples": len(rows), "label_agreement": agreement, **_differences(ours, theirs)}
    targets = [(i, e.target) for i, e in enumerate(examples) if e.target is not None]
    if targets:
        picks, wanted = [i for i, _ in targets], torch.tensor([_label_index(candidate, t) for _, t in targets])
        figures["target_accuracy"] = float((ours[picks].argmax(-1) == wanted).float().mean())
        figures["source_target_accuracy"] = float((theirs[picks].argmax(-1) == wanted).float().mean())
    return {**figures, "score": agreement, "score_name": "label agreement"}


def compare_ranking(candidate: Any, reference: Any, examples: Sequence[Example]) -> dict:
    """Rank agreement with the source per query (over all examples when they are single texts)."""
    rows = example_rows(candidate, examples)
    ours, theirs = pipeline_scores(candidate, rows)[:, 0], pipeline_scores(reference, rows)[:, 0]
    groups = _groups(examples)
    pairs = [(ours[g].tolist(), theirs[g].tolist()) for g in groups]
    agreement = metrics.order_agreement(pairs)
    figures = {"examples": len(rows), "queries": len(groups), "rank_agreement": agreement,
               "top1_agreement": metrics.top1_agreement(pairs), **_differences(ours, theirs)}
    scored = [g for g in groups if all(examples[i].target is not None for i in g)]
    if scored:
        given = [[float(examples[i].target) for i in g] for g in scored]
        figures["target_rank_agreement"] = metrics.order_agreement(
            (ours[g].tolist(), t) for g, t in zip(scored, given))
        figures["source_target_rank_agreement"] = metrics.order_agreement(
            (theirs[g].tolist(), t) for g, t in zip(scored, given))
    return {**figures, "score": agreement, "score_name": "rank agreement"}


def pipeline_scores(model: Any, rows: list) -> torch.Tensor:
    """[rows, labels] scores as the text-classification pipeline gives them."""
    logits = torch.stack([out["logits"].float() for out in model.run_rows(rows)])
    return apply(logits, default_function(model.config))


def _label_index(model: Any, label: str) -> int:
    """The output index of a target label; one the model does not have is refused, named."""
    for index, name in model.labels.items():
        if name == label:
            return index
    raise HotrodError(f"target label {label!r} is not one of the model's labels ({', '.join(model.labels.values())})")


def _differences(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    difference = (ours - theirs).abs()
    return {"score_mean_abs": float(difference.mean()), "score_max_abs": float(difference.max())}


def _groups(examples: Sequence[Example]) -> list[list[int]]:
    """Example indices per query, in the order queries first appear; single texts form one group."""
    if all(e.pair is None for e in examples):
        return [list(range(len(examples)))]
    groups: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        groups.setdefault(example.text, []).append(i)
    return list(groups.values())
