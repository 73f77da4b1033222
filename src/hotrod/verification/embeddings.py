"""feature-extraction encoders: last hidden state max-abs and cosine, and the cosine of the embeddings the
model gives (`HotrodModel.embed`: a sentence-transformers checkpoint's own pooling, Dense and normalization,
else mean pooling), which is what its users compare."""

from __future__ import annotations

from typing import Any

import torch


def compare_embeddings(candidate: Any, reference: Any, rows: list[torch.Tensor]) -> dict:
    max_abs, cosines, embeddings = 0.0, [], []
    name = candidate.spec.contracts(candidate.dims)["encoder"].output_names[0]
    for ids in rows:
        ours = candidate(ids)[name].float()[0]
        theirs = reference(ids)[name].float()[0]
        max_abs = max(max_abs, float((ours - theirs).abs().max()))
        cosines.append(float(torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).mean()))
        ours_vector, theirs_vector = candidate.embed(ids)[0].float(), reference.embed(ids)[0].float()
        embeddings.append(float(torch.nn.functional.cosine_similarity(ours_vector, theirs_vector, dim=0)))
    return {
        "hidden_max_abs": max_abs,
        "hidden_cosine": _mean(cosines),
        "embedding_cosine": _mean(embeddings),
        "embedding_cosine_min": min(embeddings),
        "score": _mean(embeddings),
        "score_name": "embedding cosine",
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
