"""The small host-side values a decoding step feeds its graph, and prompts compacted for a prefill.

A decoding step's few small host values (each row's length and position) are computed in numpy, and fed
as numpy arrays: a torch call's code is cold again after every graph run has streamed the weights through
the caches, and asking a tensor its shape, type and device to copy it into a bound buffer is a large part
of a step's time outside its graph run; numpy's calls (its tolist among them) cost several times less.
The arrays a step feeds unchanged are made once per shape and shared, never written to (backends copy or
read feeds).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from hotrod.errors import HotrodError


@functools.lru_cache(maxsize=4096)
def int32_scalar(value: int) -> np.ndarray:
    """A 0-d int32 array of `value`, made once: a decoding step feeds its length as one. Never written to
    (backends copy or read feeds)."""
    return np.array(value, dtype=np.int32)


@functools.lru_cache(maxsize=256)
def zeros_column(rows: int) -> np.ndarray:
    """[rows, 1] int64 zeros, made once per row count (as `int32_scalar`): each row's logits position in a
    step."""
    return np.zeros((rows, 1), dtype=np.int64)


def on_host(values: torch.Tensor | np.ndarray) -> np.ndarray | torch.Tensor:
    """Token ids as a numpy array where they are on the CPU (see the module doc), else the tensor itself."""
    if isinstance(values, np.ndarray) or values.device.type != "cpu":
        return values
    return values.numpy()


def token_column(values: torch.Tensor | np.ndarray) -> np.ndarray | torch.Tensor:
    """[rows] -> [rows, 1] (a step's one token a row), a numpy array on the CPU (see the module doc)."""
    return on_host(values)[:, None]


def last_position(logits: torch.Tensor) -> torch.Tensor:
    """[rows, width, vocab] -> the last position's [rows, vocab], through numpy where it can (see the module
    doc): a torch tensor on the numpy result."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        return torch.from_numpy(logits.numpy()[:, -1])
    return logits[:, -1]


def as_fp32(logits: torch.Tensor) -> torch.Tensor:
    """Logits as float32; fp32 logits as they are, without a call into torch (its code cold again after
    every graph run has streamed the weights through the caches)."""
    return logits if logits.dtype == torch.float32 else logits.float()


@functools.lru_cache(maxsize=256)
def position_spans(rows: int, width: int) -> np.ndarray:
    """[rows, width] of 0 .. width-1, made once per shape (as `zeros_column`): every position's logits in a
    pass that verifies a draft."""
    return np.tile(np.arange(width), (rows, 1))  # its own memory, writable (a broadcast view is neither)


CACHED_SPAN_ELEMENTS = 4096  # prompts' positions up to this many are `position_spans`' cached arrays


def prompt_positions(rows: int, width: int) -> np.ndarray:
    """Every position's index in a prompt of `rows` x `width`: `position_spans`' array, made once, where it
    is small; a long prompt's of its own (256 cached arrays of long prompts would hold hundreds of
    megabytes)."""
    if rows * width <= CACHED_SPAN_ELEMENTS:
        return position_spans(rows, width)
    return np.tile(np.arange(width), (rows, 1))


def expand_index(rows: int, expand: int) -> torch.Tensor:
    """Each row's index repeated `expand` times in a row (a prompt's beams)."""
    return torch.arange(rows).repeat_interleave(expand)


def compact_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's real tokens moved to the front, in order: (ids, their original columns, lengths).

    The result is right-padded to the longest row, rounded up to a `multiple` of columns (see
    `hotrod.generation.cache.DecoderState.width_multiple`). Dropping the masked tokens computes exactly what
    masking them does; a row's generation positions count its real tokens (as transformers' do).
    """
    rows, width = input_ids.shape
    if width and bool(attention_mask.all()):  # no padding (a lone prompt, most often): nothing moves
        ids, order = input_ids, torch.arange(width).expand(rows, width)
        lengths = torch.full((rows,), width, dtype=torch.long)
    else:
        lengths = attention_mask.ne(0).sum(dim=1)
        if not bool((lengths > 0).all()):
            raise HotrodError("a prompt row has no tokens (its attention_mask is all zeros)")
        order = torch.sort(attention_mask.eq(0).int(), dim=1, stable=True).indices[:, : int(lengths.max())]
        ids = input_ids.gather(1, order)
    extra = -ids.shape[1] % multiple
    if extra:  # columns past every row's length: written to the cache past its length, never read
        ids = torch.nn.functional.pad(ids, (0, extra))
        order = torch.nn.functional.pad(order, (0, extra), value=input_ids.shape[1] - 1)
    return ids, order, lengths
