"""DeBERTa-v2's disentangled attention: content-to-content scores plus content-to-position (c2p) and
position-to-content (p2c) scores over the relative distance of each (query, key) pair.

Each pair's distance i - j is bucketed (`position_buckets`: exact up to half the buckets, log-spaced up to
`max_relative_positions`) and shifted and clamped into the `2 * span` rows of the relative embeddings
(`encoder.rel_embeddings`, after their LayerNorm where `norm_rel_ebd` names one). Those indices depend only
on the distance, so they are computed once, when the module is built, for every distance up to the one
past which they no longer change (`RelativePositions`), by the same torch operations transformers runs
(`make_log_bucket_position`). A forward reads each pair's indices from those tables by its clamped distance,
computed from the input's shape: the graph stays dynamic in the sequence axis and holds no logarithm to
round differently from torch's near a bucket's edge.

The c2p and p2c scores depend on the queries and keys, so each layer computes them ([B, H, S, S], scaled
by 1 / sqrt(head_size * factor), factor 1 + one for each of c2p and p2c) and adds them to the padding mask:
the layer's attention is then the one fused op every encoder family exports
(`hotrod.models.attention.multi_head_attention`), with that additive bias and the same scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hotrod.models.attention import multi_head_attention, split_heads
from hotrod.models.common import FusedProjection
from hotrod.models.packing import Packing

C2P, P2C = "c2p", "p2c"
_LONGEST = 1 << 16  # a table reaches at most this far (bucketed distances saturate long before)


def log_bucket(distance: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """transformers' `make_log_bucket_position`, on long distances: exact within half the buckets,
    log-spaced beyond."""
    sign = torch.sign(distance)
    mid = buckets // 2
    near = (distance < mid) & (distance > -mid)
    abs_pos = torch.where(near, torch.tensor(mid - 1).type_as(distance), torch.abs(distance))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, distance.type_as(log_pos), log_pos * sign).to(torch.long)


def relative_span(config) -> tuple[int, int, int]:
    """(position_buckets, max_relative_positions, span) as transformers resolves them: the relative
    embeddings have 2 * span rows."""
    buckets = getattr(config, "position_buckets", -1)
    max_relative = getattr(config, "max_relative_positions", -1)
    if max_relative < 1:
        max_relative = config.max_position_embeddings
    return buckets, max_relative, buckets if buckets > 0 else max_relative


class RelativePositions(nn.Module):
    """The c2p and p2c indices into the relative embeddings of every distance -reach..reach; past `reach`
    both are clamped to an end of the table, as they are at `reach` itself."""

    def __init__(self, config):
        super().__init__()
        buckets, max_relative, span = relative_span(config)

        def bucketed(distance: torch.Tensor) -> torch.Tensor:
            return log_bucket(distance, buckets, max_relative) if buckets > 0 else distance

        reach = max(span, max_relative, 1)
        while reach < _LONGEST and bucketed(torch.tensor([reach])).abs().item() < span:
            reach *= 2
        self.reach = reach
        relative = bucketed(torch.arange(-reach, reach + 1))
        self.register_buffer("c2p", (relative + span).clamp(0, 2 * span - 1), persistent=False)
        self.register_buffer("p2c", (-relative + span).clamp(0, 2 * span - 1), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, ...] -> the c2p and p2c indices [S, S] of each pair (row i - column j)."""
        positions = torch.arange(x.shape[1], device=x.device)
        distance = (positions[:, None] - positions[None, :]).clamp(-self.reach, self.reach) + self.reach
        return self.c2p[distance], self.p2c[distance]


@dataclass(frozen=True)
class PackedRows:
    """What each layer's attention takes on the packed way: where the real tokens are, and the padded rows'
    additive mask [B, 1, S, S]."""

    packing: Packing
    bias: torch.Tensor


class DisentangledSelfAttention(nn.Module):
    """`attention.self`: query_proj, key_proj, value_proj, and where they are not shared with the content
    projections (`share_att_key`), pos_key_proj (c2p) and pos_query_proj (p2c)."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        head_size = getattr(config, "attention_head_size", hidden // self.num_heads)
        width = self.num_heads * head_size
        self.query_proj = nn.Linear(hidden, width)
        self.key_proj = nn.Linear(hidden, width)
        self.value_proj = nn.Linear(hidden, width)
        self.qkv = FusedProjection(self.query_proj, self.key_proj, self.value_proj)
        self.share_att_key = getattr(config, "share_att_key", False)
        self.pos_att_type = tuple(t for t in (config.pos_att_type or ()) if t in (C2P, P2C))
        self.relative_attention = getattr(config, "relative_attention", False)
        if self.relative_attention and not self.share_att_key:
            if C2P in self.pos_att_type:
                self.pos_key_proj = nn.Linear(hidden, width)
            if P2C in self.pos_att_type:
                self.pos_query_proj = nn.Linear(hidden, width)
        factor = 1 + len(self.pos_att_type)
        # transformers' float32 sqrt(head_size * factor), by which it divides every score
        self.root = float(torch.sqrt(torch.tensor(head_size, dtype=torch.float) * factor))

    def forward(self, x, bias, relative):
        """x [B, S, hidden] and `bias` the additive padding mask [B, 1, S, S], or x [tokens, hidden] and `bias`
        PackedRows; `relative` None or (the relative embeddings [2 * span, hidden], c2p and p2c indices [S, S])."""
        q, k, v = self.qkv(x)
        packing = bias.packing if isinstance(bias, PackedRows) else None
        if packing is not None:  # the packed way: attention over the padded rows, packed again after
            q, k, v, bias = packing.unpack(q), packing.unpack(k), packing.unpack(v), bias.bias
        if self.relative_attention and self.pos_att_type:
            bias = bias + self.position_scores(q, k, *relative)
        out = multi_head_attention(q, k, v, bias, self.num_heads, 1.0 / self.root)
        return out if packing is None else packing.pack(out)

    def _positions(self, projection: nn.Module, embeddings: torch.Tensor) -> torch.Tensor:
        """[2 * span, hidden] -> [H, 2 * span, D]"""
        return split_heads(projection(embeddings)[None], self.num_heads)[0]

    def position_scores(self, q, k, embeddings, c2p_index, p2c_index) -> torch.Tensor:
        """[B, H, S, S]: the c2p and p2c scores, each divided by the root, as transformers sums them."""
        queries, keys = split_heads(q, self.num_heads), split_heads(k, self.num_heads)
        shape = (queries.shape[0], queries.shape[1], -1, -1)
        score = 0
        if C2P in self.pos_att_type:
            positions = self._positions(self.key_proj if self.share_att_key else self.pos_key_proj, embeddings)
            c2p = torch.gather(torch.matmul(queries, positions.transpose(-1, -2)), -1, c2p_index.expand(shape))
            score = score + c2p / self.root
        if P2C in self.pos_att_type:
            positions = self._positions(self.query_proj if self.share_att_key else self.pos_query_proj, embeddings)
            p2c = torch.gather(torch.matmul(keys, positions.transpose(-1, -2)), -1, p2c_index.expand(shape))
            score = score + p2c.transpose(-1, -2) / self.root
        return score
