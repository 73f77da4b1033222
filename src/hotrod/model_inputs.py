"""What a HotrodModel takes as input, checked before any graph runs: token id batches, masks, token types
and the rows `embed` reads, each refusal one line naming what is wrong."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy
import torch

from hotrod.errors import HotrodError
from hotrod.registry import Dims


def token_ids(input_ids: Any, dims: Dims, check_length: bool = True) -> torch.Tensor:
    """A [batch, length] LongTensor on the CPU of ids within the vocabulary (and the positions)."""
    if input_ids is None:
        raise HotrodError("input_ids is required")
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError):
        raise HotrodError("input_ids must be a rectangular batch of token ids (pad shorter prompts)") from None
    if ids.dim() == 1:
        ids = ids[None, :]
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise HotrodError(f"input_ids must be a 2-D tensor of token ids, got shape {tuple(ids.shape)} {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise HotrodError("empty prompt")
    ids = ids.long().cpu()
    if int(ids.min()) < 0 or int(ids.max()) >= dims.vocab_size:
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise HotrodError(f"token id {bad} is outside the vocabulary (0..{dims.vocab_size - 1})")
    if check_length and dims.max_positions is not None and ids.shape[1] > dims.max_positions:
        raise HotrodError(f"prompt of {ids.shape[1]} tokens is longer than the model's {dims.max_positions} positions")
    return ids


def check_row(row: Sequence[int], dims: Dims) -> None:
    token_ids(torch.tensor([row], dtype=torch.long) if row else torch.zeros(1, 0, dtype=torch.long), dims)


def as_long(tensor: Any, shape: Sequence[int]) -> torch.Tensor:
    """A mask (or token types) of `shape`, as a LongTensor on the CPU."""
    tensor = torch.as_tensor(tensor).long().cpu()
    if tensor.dim() == 1:
        tensor = tensor[None, :]
    if tuple(tensor.shape) != tuple(shape):
        raise HotrodError(f"mask shape {tuple(tensor.shape)} does not match input_ids {tuple(shape)}")
    return tensor


def as_mask(attention_mask: Any, shape: Sequence[int], left: bool = False) -> torch.Tensor:
    """An attention mask of `shape` holding only 0 and 1 (a 0.5 would be cut to 0 here, where transformers
    would weigh the position by it), as a LongTensor on the CPU. With `left` (a decoder-only model's prompts to
    generate from), no row may end in padding: transformers would generate after the pad tokens, hotrod after
    the prompt, so such a call would answer differently; it is refused instead."""
    values = torch.as_tensor(attention_mask)
    odd = values[(values != 0) & (values != 1)]
    if odd.numel():
        raise HotrodError(f"attention_mask must hold only 0 and 1, got {odd.flatten()[0].item()!r}")
    mask = as_long(values, shape)
    return left_padded(mask) if left else mask


def left_padded(mask: torch.Tensor) -> torch.Tensor:
    """`mask`, where no row ends in padding (see `as_mask`); also for a mask inferred from pad tokens."""
    right = ((mask[:, -1] == 0) & (mask.sum(dim=1) > 0)).nonzero() if mask.shape[1] else []
    if len(right):
        raise HotrodError(f"attention_mask row {int(right[0])} is padded on the right; a decoder-only model's prompts "
                          "are padded on the left (tokenizer.padding_side = 'left'), as transformers asks")
    return mask


def token_types(token_type_ids: Any, shape: Sequence[int], dims: Dims) -> torch.Tensor:
    """Token types within the model's table; a model without one (type_vocab_size 0) takes only zeros."""
    types = as_long(token_type_ids, shape)
    count = max(dims.type_vocab_size, 1)
    outside = types[(types < 0) | (types >= count)]
    if outside.numel():
        takes = f"token types 0 .. {count - 1}" if count > 1 else "token type 0 only"
        raise HotrodError(f"token_type_ids holds {int(outside[0])}, but this model takes {takes}")
    return types


def embed_rows(texts_or_ids: Any, tokenizer: Any, dims: Dims) -> list[list[int]]:
    """The token rows `embed` reads: texts (tokenized, cut to the positions), one row of ids, or rows."""
    if isinstance(texts_or_ids, str):
        texts_or_ids = [texts_or_ids]
    if isinstance(texts_or_ids, torch.Tensor):
        texts_or_ids = texts_or_ids.tolist() if texts_or_ids.dim() == 2 else [texts_or_ids.tolist()]
    if not isinstance(texts_or_ids, list | tuple):
        raise HotrodError(f"embed() takes a text, a list of texts, or token ids; got {type(texts_or_ids).__name__}")
    items = list(texts_or_ids)
    if items and all(_is_id(t) for t in items):  # one row of ids
        items = [items]
    if not items:
        raise HotrodError("nothing to embed")
    if any(isinstance(t, str) for t in items):
        odd = next((i for i, t in enumerate(items) if not isinstance(t, str)), None)
        if odd is not None:
            raise HotrodError(f"input {odd} is a {type(items[odd]).__name__}, beside texts; embed texts or token id "
                              "rows, each alone")
        if tokenizer is None:
            raise HotrodError("this model has no tokenizer; pass token ids instead of text")
        if any(not t.strip() for t in items):
            raise HotrodError("empty text")
        limit = dims.max_positions or None
        items = tokenizer(items, truncation=limit is not None, max_length=limit)["input_ids"]
    rows = [_id_row(r, i) for i, r in enumerate(items)]
    for row in rows:
        check_row(row, dims)
    return rows


def _is_id(value: Any) -> bool:
    """A whole number (Python's, numpy's, a 0-d integer tensor), not a bool."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | numpy.bool_)


def _id_row(row: Any, index: int) -> list[int]:
    """One row of token ids (a list, a tensor, a numpy array); anything else (a float, a nested list, None) is
    one line naming the row."""
    values = row.tolist() if hasattr(row, "tolist") else row
    if not isinstance(values, list | tuple) or not all(_is_id(v) for v in values):
        raise HotrodError(f"input {index} is not a row of token ids (whole numbers): {str(row)[:60]}")
    return [int(v) for v in values]


def padded_batch(rows: list[list[int]], left: bool, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows as one batch and its mask, `multiple` columns at a time wide, padded with 0 on the side the
    model's prompts take padding (left for a decoder-only model, whose new tokens follow the prompt; right for
    an encoder's input, whose absolute positions must start at 0 in every row)."""
    width = max(len(r) for r in rows)
    width += -width % multiple
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row)
        mask[i, span] = 1
    return ids, mask
