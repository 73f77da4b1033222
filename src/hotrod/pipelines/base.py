"""The rows a task runs through an encoder head, and what every task checks of its inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hotrod.errors import HotrodError


@dataclass(frozen=True)
class Row:
    """One model input: token ids and, for families that have them, token types (a text pair's second
    text is type 1)."""

    input_ids: list[int]
    token_type_ids: list[int] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


def padded(rows: Sequence[Row], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token ids, attention mask and token types of a batch of rows, [rows, longest] each, every row padded on
    the right to the longest (ids with `pad`, mask and types with 0)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([r.input_ids + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    types = torch.tensor([(r.token_type_ids or [0] * len(r)) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    return ids, mask, types


@dataclass
class Prepared:
    """A task's rows and what its `finish` needs: `state` is the task's own (offsets, windows, ...)."""

    rows: list[Row]
    state: Any = None
    options: dict[str, Any] = field(default_factory=dict)


def require_tokenizer(model: Any, method: str) -> Any:
    if model.tokenizer is None:
        raise HotrodError(f"{method}() needs the model's tokenizer, and this model has none")
    return model.tokenizer


def check_text(text: Any, what: str) -> str:
    """A non-empty string, else one line naming `what`."""
    if not isinstance(text, str):
        raise HotrodError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise HotrodError(f"{what} is empty")
    return text


def tokenizer_limit(model: Any) -> int | None:
    """The most tokens an input takes where the reference cuts at the tokenizer's own limit (its
    model_max_length: sentence-transformers' Transformer and CrossEncoder, transformers' token-classification
    and zero-shot pipelines), capped at the model's positions; an unset limit (a huge number) is none."""
    positions = model.dims.max_positions or None
    own = getattr(model.tokenizer, "model_max_length", None)
    own = own if isinstance(own, int) and 0 < own < 10**9 else None
    return min(x for x in (own, positions) if x is not None) if (own or positions) else None


def too_long(model: Any, name: str, count: int, limit: int, truncatable: bool) -> HotrodError:
    """The refusal of an input of `count` tokens past `limit`: the positions', or the tokenizer's own."""
    bound = (f"the model's {limit} positions" if limit == model.dims.max_positions
             else f"the {limit} tokens its tokenizer takes (model_max_length)")
    return HotrodError(f"{name} has {count} tokens, more than {bound}; shorten it"
                       + (" or ask for truncation" if truncatable else ""))


def encode(model: Any, texts: Sequence[str], pairs: Sequence[str] | None = None, truncate: bool = False,
           what: str = "text", cut: str = "longest_first", names: Sequence[str] | None = None,
           limit: int | None = None) -> list[Row]:
    """Tokenize texts (or text pairs) as the model's tokenizer does for transformers' pipelines; an input
    past `limit` (default: the model's positions) is refused, naming it (`names[i]`, else `what i`), unless
    `truncate` (then cut to fit by the tokenizer's strategy `cut`: the longer text of a pair first, or only the
    first)."""
    tokenizer = model.tokenizer
    limit = limit or model.dims.max_positions
    kwargs = {"truncation": cut, "max_length": limit} if truncate and limit else {}
    try:
        encoded = tokenizer(list(texts), list(pairs), **kwargs) if pairs is not None else tokenizer(list(texts), **kwargs)
    except Exception as exc:  # a first text too short to cut enough from: uncut, as transformers' pipelines retry
        if not kwargs or "too short" not in str(exc):
            raise
        encoded = tokenizer(list(texts), list(pairs)) if pairs is not None else tokenizer(list(texts))
        limit = model.dims.max_positions  # run uncut, as the pipeline does, within the positions
    types = encoded.get("token_type_ids") if model.dims.type_vocab_size else None
    rows = []
    for i, ids in enumerate(encoded["input_ids"]):
        if limit and len(ids) > limit:
            name = names[i] if names is not None else f"{what} {i}"
            raise too_long(model, name, len(ids), limit, truncatable=not kwargs)
        rows.append(Row(list(ids), list(types[i]) if types is not None else None))
    return rows
