"""Encoders without padding: a batch's real tokens packed into one [tokens, hidden] tensor.

Projections, norms and feed-forward layers work token by token, so on the packed tensor they cost the
batch's real tokens only, not rows x its longest row (the effective_transformer idea). Attention is the
one op that needs the rows: it runs on a nested jagged tensor over the same packed values (offsets per
row), which `scaled_dot_product_attention` takes as variable-length sequences (flash / memory-efficient
kernels on a GPU), so it too never computes a padded position.

The packed path is a second way through the same modules, used by the static engine (`runtime/static.py`)
for batches that have padding; the exported ONNX graph and the CPU reference keep the padded path.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Packing:
    """Where a padded [B, S] batch's real tokens are: `index` into its flattened B*S positions, in row
    order, and `offsets` [B + 1] where each row's tokens start in the packed tensor."""

    index: torch.Tensor
    offsets: torch.Tensor
    rows: int
    width: int

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> Packing:
        keep = attention_mask.to(torch.bool)
        lengths = keep.sum(dim=1)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        index = keep.flatten().nonzero().squeeze(1)  # reads back the token count (one sync a batch)
        return cls(index, offsets, keep.shape[0], keep.shape[1])

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] -> [tokens, ...]"""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[tokens, ...] -> [B, S, ...], zeros at padded positions."""
        out = x.new_zeros((self.rows * self.width, *x.shape[1:]))
        return out.index_copy_(0, self.index, x).view(self.rows, self.width, *x.shape[1:])


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, num_heads: int,
                     scale: float) -> torch.Tensor:
    """Bidirectional attention within each row: q, k, v [tokens, H*D] -> [tokens, H*D]."""
    tokens, width = q.shape

    def jagged(x: torch.Tensor) -> torch.Tensor:  # [tokens, H*D] -> nested [B, H, j, D]
        heads = x.reshape(tokens, num_heads, width // num_heads).contiguous()  # a fused projection's slice
        return torch.nested.nested_tensor_from_jagged(heads, packing.offsets).transpose(1, 2)

    with warnings.catch_warnings():  # on a CPU torch's math fallback goes through its older nested layout
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
        out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), scale=scale)
    return out.transpose(1, 2).values().reshape(tokens, width)
