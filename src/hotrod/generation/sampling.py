"""Score processing, as small pure functions with transformers' semantics and order.

Order (as transformers): repetition penalty, minimum length; then, when sampling, temperature,
top-k, top-p. Each takes scores [rows, vocab] and returns new scores.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from hotrod.generation.config import Settings


def repetition_penalty(scores: torch.Tensor, sequences: torch.Tensor, penalty: float, skip: torch.Tensor | None):
    """Penalise every token already in a row (CTRL-style); `skip[r]` leading positions (padding) don't count."""
    ids = sequences.to(scores.device)
    if skip is not None:
        skip = skip.to(scores.device)
        positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
        ids = ids.masked_fill(positions < skip[:, None], scores.shape[-1])
    seen = torch.zeros(scores.shape[0], scores.shape[1] + 1, dtype=torch.bool, device=scores.device)
    seen.scatter_(1, ids, True)
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen[:, :-1], penalised, scores)


def argmax(scores: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest score, the first on a tie, a NaN counting as largest (torch's rule).

    On the CPU numpy's reduction does it: torch's CPU argmax over a vocabulary is not vectorised (numpy's
    is, and many times faster over a vocabulary of tens of thousands), and it runs once per generated
    token. Elsewhere, and for types numpy lacks, torch's own.
    """
    ids = _numpy_argmax(scores)
    return torch.argmax(scores, dim=-1) if ids is None else torch.from_numpy(np.asarray(ids))  # 0-d for one row


def argmax_ids(scores: torch.Tensor) -> list[int]:
    """`argmax` as a list of Python ints (one per row, or one for a 1-D row): on the CPU straight from
    numpy, with no torch tensor made and indexed for a caller that wants the ids themselves."""
    ids = _numpy_argmax(scores)
    ids = torch.argmax(scores, dim=-1).tolist() if ids is None else ids.tolist()
    return ids if isinstance(ids, list) else [ids]


def _numpy_argmax(scores: torch.Tensor) -> np.ndarray | np.integer | None:
    """numpy's argmax over the last axis where numpy can read the scores in place (see `argmax`), else None."""
    if scores.device.type != "cpu" or scores.dtype not in (torch.float32, torch.float64):
        return None
    return scores.numpy(force=scores.requires_grad).argmax(axis=-1)


def suppress(scores: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor:
    """`token_ids` made impossible in every row. Their index tensor is made once per device: indexing a GPU
    tensor with a Python list copies the list from pageable host memory, which waits for the GPU's queue to
    drain (on an H200, one of a GPT-2 step's three waits when `min_new_tokens` holds EOS back)."""
    return scores.index_fill(1, _index_on(tuple(token_ids), scores.device), -float("inf"))


@functools.lru_cache(maxsize=64)
def _index_on(token_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(token_ids, dtype=torch.long, device=device)


def top_k(scores: torch.Tensor, k: int, min_keep: int = 1) -> torch.Tensor:
    k = min(max(k, min_keep), scores.shape[-1])
    threshold = torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(scores < threshold, -float("inf"))


def top_p(scores: torch.Tensor, p: float, min_keep: int = 1) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches `p`."""
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1 - p)
    drop_sorted[..., -min_keep:] = False
    drop = drop_sorted.scatter(1, order, drop_sorted)
    return scores.masked_fill(drop, -float("inf"))


def plain_argmax(s: Settings, length: int) -> bool:
    """Whether the token after a row of `length` tokens is the raw logits' argmax: greedy, and nothing in
    `process` changes the scores there. Kept beside `process`, whose conditions it mirrors."""
    return not s.do_sample and s.repetition_penalty == 1.0 and (not s.eos_token_ids or length >= s.min_length)


def process(
    scores: torch.Tensor, sequences: torch.Tensor, s: Settings, skip: torch.Tensor | None, min_keep: int = 1
) -> torch.Tensor:
    """Apply every processor the settings ask for, in transformers' order (`plain_argmax` says when none
    changes a greedy choice)."""
    if s.repetition_penalty != 1.0:
        scores = repetition_penalty(scores, sequences, s.repetition_penalty, skip)
    if s.eos_token_ids and sequences.shape[1] < s.min_length:
        scores = suppress(scores, s.eos_token_ids)
    if s.do_sample:
        if s.temperature != 1.0:
            scores = scores / s.temperature
        if s.top_k:
            scores = top_k(scores, s.top_k, min_keep)
        if s.top_p < 1.0:
            scores = top_p(scores, s.top_p, min_keep)
    return scores
