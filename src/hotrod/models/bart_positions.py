"""The absolute positions of the BART-like families (`hotrod.models.bart_stack`), one class per way:

- `LearnedPositions` (BART, mBART): a trained table, read at position + 2 (fairseq's offset);
- `SinusoidalPositions` (Marian, Pegasus): a fixed table, sin in the first half of each row and cos in the
  second, read at the position itself;
- `PaddedSinusoidalPositions` (M2M100, NLLB): fairseq's sinusoids, counted from the token ids as fairseq
  does: a token equal to the pad id reads the zero row at `pad`, every other token `pad + 1 + n`, n the
  non-pad tokens before it (and the row's past).

Each is called as positions(input_ids, past): `past` [B] is each row's length before these tokens (None: no
past, the encoder and the first decoder step). Where a decoding step passes a token and its draft, the
tokens follow one another from there.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def _row_positions(input_ids: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor:
    """[B, S]: past[b] + 0 .. S - 1 (0 .. S - 1 without a past). Never below 0: the export traces a step on
    dummy rows shorter than its queries, which a real step never is."""
    steps = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
    if past is None:
        return steps
    return (past.long()[:, None] + steps).clamp(min=0)


class LearnedPositions(nn.Module):
    """BART's learned table of `max_positions` + 2 rows, read at position + 2; the weight is the checkpoint's
    `embed_positions.weight`."""

    OFFSET = 2

    def __init__(self, max_positions: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_positions + self.OFFSET, dim))

    def forward(self, input_ids: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
        return nn.functional.embedding(_row_positions(input_ids, past) + self.OFFSET, self.weight)


def marian_sinusoids(rows: int, dim: int) -> torch.Tensor:
    """transformers' MarianSinusoidalPositionalEmbedding.create_weight, computed the same way (float64 numpy,
    then fp32): sin of the even angles in the first half, cos of the odd ones in the second."""
    angles = np.arange(rows, dtype=np.float64)[:, None] / np.power(10000, 2 * (np.arange(dim) // 2) / dim)[None, :]
    out = torch.empty(rows, dim, dtype=torch.float32)
    sentinel = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out[:, :sentinel] = torch.FloatTensor(np.sin(angles[:, 0::2]))
    out[:, sentinel:] = torch.FloatTensor(np.cos(angles[:, 1::2]))
    return out


class SinusoidalPositions(nn.Module):
    """Marian's and Pegasus's fixed table, read at the position itself. Not a weight: transformers computes
    it (Marian's checkpoints do not hold it); a checkpoint that holds one (Pegasus) gives its own
    (`load`)."""

    def __init__(self, max_positions: int, dim: int):
        super().__init__()
        self.register_buffer("table", marian_sinusoids(max_positions, dim), persistent=False)

    def load(self, weight: torch.Tensor | None) -> None:
        if weight is not None and weight.shape == self.table.shape:
            self.table.copy_(weight)

    def forward(self, input_ids: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
        return nn.functional.embedding(_row_positions(input_ids, past), self.table)


def fairseq_sinusoids(rows: int, dim: int, pad: int | None) -> torch.Tensor:
    """transformers' M2M100SinusoidalPositionalEmbedding.get_embedding: sin | cos halves (a zero column for
    an odd width), the pad row zero."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
    angles = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).view(rows, -1)
    if dim % 2 == 1:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    if pad is not None:
        table[pad, :] = 0
    return table


class PaddedSinusoidalPositions(nn.Module):
    """M2M100's (and NLLB's) positions: from the token ids, the pad token's own row zero (see the module doc)."""

    def __init__(self, max_positions: int, dim: int, pad: int):
        super().__init__()
        self.pad = pad
        rows = max_positions + max(2, pad + 1)  # transformers' table has max_positions + 2 rows and grows past it
        self.register_buffer("table", fairseq_sinusoids(rows, dim, pad), persistent=False)

    def forward(self, input_ids: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
        real = (input_ids != self.pad).long()
        counted = torch.cumsum(real, dim=1)
        if past is not None:
            counted = counted + past.long()[:, None]
        return nn.functional.embedding(counted * real + self.pad, self.table)
