"""Sparse (SPLADE) embeddings: `model.embed_sparse(texts)` gives what sentence-transformers'
`SparseEncoder(path).encode(texts)` gives, densified: one weight per vocabulary entry, [n, vocab].

The weights come out of the graph whole (`hotrod.models.heads.SpladeHead`: the masked-LM logits pooled as
SpladePooling pools them); this pipeline tokenizes as the checkpoint's Transformer module does (its prompts,
lowercasing and max_seq_length, `hotrod.pipelines.sentence_tokens`) and keeps each vector's largest
`max_active_dims` entries as encode does. A dense tensor is the answer because it is what users compare,
add and index; `entries` gives text-embeddings-inference's shape (/embed_sparse: each text's non-zero
entries as {"index", "value"}), and `tokens` the entries with their tokens, largest first (the command's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.pipelines import splade
from hotrod.pipelines.base import Prepared, Row, check_text, require_tokenizer
from hotrod.pipelines.sentence import PLAIN
from hotrod.pipelines.sentence_tokens import tokenize

OUTPUT = "embeddings"  # the graph's output: [batch, vocab]
SIDES = ("right", "left")


def prepare(model: Any, texts: str | Sequence[str], max_active_dims: int | None = None,
            prompt_name: str | None = None, prompt: str | None = None, truncate: bool = True,
            truncation_direction: str = "right") -> Prepared:
    """`model.embed_sparse(texts, ...)`: SPLADE vectors [n, vocab] (fp32, on the CPU), what
    `SparseEncoder(path).encode(texts, prompt_name=, prompt=, max_active_dims=)` gives, densified
    (`.to_dense()`); one row per text.

    `max_active_dims` keeps each vector's largest entries only (default: the checkpoint's own, else all);
    `prompt_name` / `prompt` put one of the checkpoint's prompts, or one's own, before each text (default:
    its default prompt). Texts are cut at the checkpoint's max_seq_length as encode cuts them; `truncate`
    False refuses such a text instead, and `truncation_direction` "left" keeps a text's end (TEI's options)."""
    require_tokenizer(model, "embed_sparse")
    items = [texts] if isinstance(texts, str) else texts
    if not isinstance(items, Sequence) or not items:
        raise HotrodError("texts must be a text or a non-empty list of texts")
    items = [check_text(text, f"text {i}") for i, text in enumerate(items)]
    pipe = model.sentence or PLAIN
    known = dict(pipe.prompts)
    if prompt_name is not None and prompt_name not in known:
        raise HotrodError(f"prompt_name {prompt_name!r} is not one of this model's prompts "
                          f"({', '.join(known) or 'it has none'})")
    chosen = pipe.resolve_prompt(prompt, prompt_name)
    side = str(truncation_direction).lower()
    if side not in SIDES:
        raise HotrodError(f"truncation_direction must be right or left, got {truncation_direction!r}")
    top = default_top(model) if max_active_dims is None else max_active_dims
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise HotrodError(f"max_active_dims must be a whole number >= 1 or None, got {top!r}")
    rows = tokenize(model, items, chosen, truncate, side).rows
    return Prepared([Row(list(ids)) for ids in rows], options={"max_active_dims": top})


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """The rows' vectors [n, vocab], each with its largest `max_active_dims` entries only."""
    vectors = torch.stack([out[OUTPUT].float() for out in outputs])
    return keep_largest(vectors, prepared.options["max_active_dims"])


def default_top(model: Any) -> int | None:
    """The checkpoint's own max_active_dims (config_sentence_transformers.json), or None."""
    step = splade.of_steps((model.sentence or PLAIN).steps)
    return step.max_active_dims if step is not None else None


def keep_largest(vectors: torch.Tensor, top: int | None) -> torch.Tensor:
    """sentence-transformers' `select_max_active_dims`: each row's `top` largest entries by magnitude, the
    others zero (None: the rows as they are)."""
    if top is None or top >= vectors.shape[-1]:
        return vectors
    index = vectors.abs().topk(top, dim=-1).indices
    return torch.zeros_like(vectors).scatter_(-1, index, vectors.gather(-1, index))


def entries(vectors: torch.Tensor) -> list[list[dict[str, Any]]]:
    """text-embeddings-inference's /embed_sparse answer: each vector's non-zero entries, {"index", "value"},
    in index order."""
    found = []
    for vector in vectors:
        index = vector.nonzero().flatten()
        found.append([{"index": i, "value": v} for i, v in zip(index.tolist(), vector[index].tolist())])
    return found


def tokens(model: Any, vectors: torch.Tensor, top: int | None = None) -> list[list[dict[str, Any]]]:
    """Each vector's non-zero entries with their tokens, {"index", "token", "value"}, largest first (the first
    `top` of them): what a sparse vector says, in words."""
    found = []
    for row in entries(vectors):
        row = sorted(row, key=lambda e: -e["value"])[:top]
        names = model.tokenizer.convert_ids_to_tokens([e["index"] for e in row]) if model.tokenizer else []
        found.append([{**e, "token": name} for e, name in zip(row, names or [None] * len(row))])
    return found
