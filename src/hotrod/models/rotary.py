"""Rotary position embeddings, exported as one `RotaryEmbedding` node (com.microsoft) over a [B, S, H*D]
projection, in place of each query's and key's reshape / slice / negate / concatenate chain."""

from __future__ import annotations

import torch
from torch import nn

from hotrod.models.attention import FUSED_ATTENTION_DOMAIN


def rotary_tables(positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, D/2] of the angles p * theta^(-2i/D), in fp32 as transformers computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Each head's halves (a, b) at position p become (a cos - b sin, b cos + a sin), in fp32."""
    batch, seq, width = x.shape
    heads = x.view(batch, seq, num_heads, width // num_heads).float()
    cos, sin = (torch.cat((t[:seq], t[:seq]), dim=-1)[:, None, :].float() for t in (cos, sin))
    first, second = heads.chunk(2, dim=-1)
    return (heads * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype).reshape(batch, seq, width)


class _RotaryEmbedding(torch.autograd.Function):
    """Rotary embeddings of x [B, S, H*D] at positions 0 .. S-1 from the tables [P, D/2] (rotate-half layout)."""

    @staticmethod
    def forward(ctx, x, cos, sin, num_heads: int):
        return _rotate(x, cos, sin, num_heads)

    @staticmethod
    def symbolic(g, x, cos, sin, num_heads: int):
        start = g.op("Constant", value_t=torch.zeros(1, dtype=torch.long))  # positions from 0
        out = g.op(f"{FUSED_ATTENTION_DOMAIN}::RotaryEmbedding", x, start, cos, sin, num_heads_i=num_heads,
                   interleaved_i=0)
        out.setType(x.type())
        return out


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings of the tokens at positions 0 .. S-1 of each row, for at most `positions`
    positions; the tables are buffers, cast with the model (transformers casts its tables to the
    activations' dtype too) and never read from a checkpoint."""

    def __init__(self, head_dim: int, theta: float, positions: int):
        super().__init__()
        cos, sin = rotary_tables(positions, head_dim, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        """x [B, S, H*D] -> the same, each head turned by its position's angles."""
        return _RotaryEmbedding.apply(x, self.cos, self.sin, num_heads)

