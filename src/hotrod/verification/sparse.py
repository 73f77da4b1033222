"""sparse-embedding (SPLADE) heads: the cosine of both models' sparse vectors, which is what a dot-product or
cosine retrieval over them sees, and how many of the reference's heaviest terms the candidate keeps (what
an inverted index of the top terms sees)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.pipelines.sparse import OUTPUT
from hotrod.verification.rows import example_rows

TOP_TERMS = 32  # the reference's heaviest terms per text whose presence among the candidate's is counted


def compare_sparse(candidate: Any, reference: Any, examples: Sequence[Any]) -> dict:
    rows = example_rows(candidate, examples)
    ours = torch.stack([out[OUTPUT].float() for out in candidate.run_rows(rows)])
    theirs = torch.stack([out[OUTPUT].float() for out in reference.run_rows(rows)])
    cosines = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    overlaps = [top_overlap(a, b) for a, b in zip(ours, theirs)]
    cosine = float(cosines.mean())
    return {
        "examples": len(rows),
        "sparse_cosine": cosine,
        "sparse_cosine_min": float(cosines.min()),
        "top_overlap": sum(overlaps) / len(overlaps),
        "sparse_max_abs": float((ours - theirs).abs().max()),
        "active_terms": float((theirs > 0).sum(dim=-1).float().mean()),
        "score": cosine,
        "score_name": "sparse cosine",
    }


def top_overlap(ours: torch.Tensor, theirs: torch.Tensor, k: int = TOP_TERMS) -> float:
    """The share of `theirs`' k heaviest non-zero terms that are among `ours`' k heaviest (1.0 when `theirs`
    has none)."""
    k = min(k, int((theirs != 0).sum()))
    if k == 0:
        return 1.0
    wanted = set(theirs.abs().topk(k).indices.tolist())
    kept = set(ours.abs().topk(k).indices.tolist())
    return len(wanted & kept) / k
