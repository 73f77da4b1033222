"""Reranking with a cross-encoder: each (query, document) pair's score as sentence-transformers'
`CrossEncoder.predict` gives it, and the documents best first.

The score is the one-output head's logit through the cross-encoder's activation: the one its config names
(`sentence_transformers.activation_fn`, written by sentence-transformers when it saves a model), else a
sigmoid, CrossEncoder's default for one output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.pipelines import classify
from hotrod.pipelines.base import Prepared, check_text, require_task
from hotrod.tasks import CLASSIFY

# sentence-transformers' activation classes (by the last part of their dotted name) -> classify's functions
_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "none"}


def prepare(model: Any, query: str, documents: Sequence[str], top_n: int | None = None,
            truncate: bool = False) -> Prepared:
    """One row per (query, document) pair."""
    require_task(model, CLASSIFY, "rerank")
    if model.dims.num_labels != 1:
        raise HotrodError(f"rerank() needs a cross-encoder (a head with one output); this one has "
                          f"{model.dims.num_labels} labels: use classify()")
    check_text(query, "the query")
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise HotrodError("documents must be a list of texts")
    if not documents:
        raise HotrodError("no documents to rerank")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise HotrodError(f"top_n must be a whole number >= 1 or None, got {top_n!r}")
    pairs = [(query, check_text(doc, f"document {i}")) for i, doc in enumerate(documents)]
    prepared = classify.prepare(model, pairs, None, activation(model.config), truncate)
    prepared.options["top_n"] = top_n
    return prepared


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> list[dict]:
    """[{"index", "score"}] best first (equal scores keep the documents' order), the first top_n."""
    scores = scores_of(prepared, outputs)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: prepared.options["top_n"]]
    return [{"index": i, "score": scores[i]} for i in order]


def scores_of(prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> list[float]:
    """Each pair's score, in the documents' order."""
    function = prepared.options["function"]
    return [float(classify.apply(out["logits"].float(), function)[0]) for out in outputs]


def activation(config: Any) -> str:
    """The function CrossEncoder applies to this model's logit (classify's name for it)."""
    settings = getattr(config, "sentence_transformers", None) or {}
    named = settings.get("activation_fn") if isinstance(settings, dict) else None
    if not named:
        return "sigmoid"
    short = str(named).rsplit(".", 1)[-1]
    if short not in _ACTIVATIONS:
        raise HotrodError(f"the cross-encoder's activation {named} is not one hotrod applies "
                          f"({', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[short]
