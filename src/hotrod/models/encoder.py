"""What every BERT-like encoder family shares: a stack of layers over embeddings, run padded or packed
(`hotrod.models.packing`), ended in the head the checkpoint's task names (`hotrod.models.heads`).

A family gives its embeddings, its layers (`layers`, each called as layer(x, bias) where `bias` is the
additive padding mask or, on the packed path, the Packing) and its `forward` / `forward_packed` over the
inputs its contract takes (`hotrod.contracts.encoder_io`), both through `encode` / `encode_packed`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hotrod.models.attention import additive_mask, multi_head_attention, padding_mask
from hotrod.models.heads import load_with_head
from hotrod.models.packing import Packing, packed_attention
from hotrod.registry import registered
from hotrod.tasks import build_head, unnamed_heads


def attend(q, k, v, bias, num_heads: int, scale: float) -> torch.Tensor:
    """Bidirectional attention of projections q, k, v: padded ([B, S, H*D], `bias` the additive mask) or
    packed ([tokens, H*D], `bias` the Packing)."""
    if isinstance(bias, Packing):
        return packed_attention(q, k, v, bias, num_heads, scale)
    return multi_head_attention(q, k, v, bias, num_heads, scale)


class EncoderStack(nn.Module):
    """The encoder-kind graph: its inputs -> last_hidden_state, or the outputs of the head the
    checkpoint's task names (the family's own, else the task's standard one)."""

    checkpoint_prefixes: tuple[str, ...] = ()

    def __init__(self, config, **backbone: nn.Module):
        """`backbone`: the family's modules by their checkpoint names (embeddings, layers, ...)."""
        super().__init__()
        for name, module in backbone.items():
            setattr(self, name, module)
        self.num_labels = config.num_labels
        self.head = build_head(config, registered(config.model_type))
        self.unnamed_heads = unnamed_heads(config, registered(config.model_type))  # `load_with_head` asks

    def layers(self) -> nn.ModuleList:
        """The family's layers, in order (each family names their place in its checkpoint)."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor, attention_mask: torch.Tensor):
        """Every layer over the embeddings x [B, S, H], padded positions masked out; then the head."""
        seq = x.shape[1]  # the fused op wants the bias's query axis spelled out, not broadcast
        bias = additive_mask(padding_mask(attention_mask).expand(-1, -1, seq, -1), x.dtype)
        for layer in self.layers():
            x = layer(x, bias)
        return self.finish(x, attention_mask)

    def encode_packed(self, x: torch.Tensor, attention_mask: torch.Tensor):
        """`encode` with every layer on the real tokens only: equal to it at real positions, zeros at
        padded ones."""
        packing = Packing.of(attention_mask)
        tokens = packing.pack(x)
        for layer in self.layers():
            tokens = layer(tokens, packing)
        return self.finish(packing.unpack(tokens), attention_mask)

    def finish(self, hidden, attention_mask):
        """The last hidden state, or what the head makes of it."""
        return hidden if self.head is None else self.head(hidden, attention_mask)

    def graphs(self) -> dict[str, nn.Module]:
        return {"encoder": self}

    def packed_graphs(self) -> dict[str, Callable[..., torch.Tensor]]:
        """Graphs with a packed way for batches with padding (same inputs and outputs)."""
        return {"encoder": self.forward_packed}

    def load_hf(self, state_dict: dict[str, torch.Tensor]) -> None:
        load_with_head(self, state_dict, self.checkpoint_prefixes)
