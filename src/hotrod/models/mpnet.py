"""MPNet (all-mpnet-base-v2 and its heads): BERT's post-norm layers under other names, over word and
position embeddings, with a relative position bias added to every layer's attention scores.

Weight names follow transformers' MPNetModel (`mpnet.` prefix in head checkpoints): `embeddings.*`,
`encoder.layer.N.attention.attn.{q,k,v,o}`, `attention.LayerNorm`, `intermediate.dense`, `output.dense` and
`output.LayerNorm`, and `encoder.relative_attention_bias`, the one bias table every layer shares. The
pooler serves only MPNetModel's pooled output, which no task reads: it is not loaded. Where it differs from
BERT and RoBERTa:

- no token types: the graph takes (input_ids, attention_mask) (`hotrod.contracts.encoder_io`);
- positions are RoBERTa's, counted from padding index 1, skipping padding tokens; transformers fixes that
  index at 1 whatever the config's pad_token_id says, and so does hotrod;
- each attention's scores get a bias of each (query, key) distance and head: T5's bidirectional buckets,
  32 of them up to distance 128 (transformers buckets with those defaults whatever
  `relative_attention_num_buckets` says), read from `relative_attention_bias`. Computed once a forward,
  together with the padding mask, it is one additive [B, H, S, S] bias that every layer's fused attention
  op takes (`hotrod.models.attention.multi_head_attention`);
- the classification head is RoBERTa's (`classifier.dense`, tanh, `classifier.out_proj` on the first token),
  and so is the masked-LM head (`lm_head`), run as SPLADE for sparse-embedding.

The bucket of each distance -128..128 is computed once, when the module is built, by the bucketing
transformers' equals (`hotrod.models.t5.relative_bucket`); from 128 on the bucket no longer changes. A
forward reads each pair's bucket from that table by its clamped distance: the graph holds no logarithm to
round differently from torch's (an exact power of two's bucket turns on the last bit of log's quotient) and
nothing to keep in fp32 under half precision.

The packed way (`hotrod.models.packing`, the static engine's for batches with padding) runs projections,
norms and feed-forward blocks on the real tokens only, but each layer's attention on the padded rows: the
nested variable-length attention takes no bias, and this bias is per pair of positions. Attention is the
small share of an encoder layer's work at sentence lengths (2·S·H multiply-adds a token against 12·H² in
the projections and the feed-forward block: under 3% for all-mpnet-base-v2 at 128 tokens), so nearly all
that packing saves is kept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from hotrod.models.attention import multi_head_attention, padding_mask
from hotrod.models.bert import DenseNorm, Intermediate, bert_dims
from hotrod.models.common import FusedProjection
from hotrod.models.encoder import EncoderStack
from hotrod.models.heads import ProjectedClassifier
from hotrod.models.packing import Packing
from hotrod.models.roberta import LMHeadSplade
from hotrod.models.t5 import relative_bucket
from hotrod.registry import Dims, Family, register
from hotrod.tasks.constants import CLASSIFY, SPARSE

PADDING_IDX = 1  # transformers' MPNetEmbeddings.padding_idx, fixed whatever the config's pad_token_id
NUM_BUCKETS = 32  # transformers' compute_position_bias defaults, used whatever the config says
MAX_DISTANCE = 128


@dataclass(frozen=True)
class PackedBias:
    """What each layer's attention takes on the packed way: where the real tokens are, and the padded
    rows' additive bias [B, H, S, S]."""

    packing: Packing
    bias: torch.Tensor


def attend(q, k, v, bias, num_heads: int, scale: float) -> torch.Tensor:
    """Attention with the relative bias: padded ([B, S, H*D], `bias` additive [B, H, S, S]) or packed
    ([tokens, H*D], `bias` a PackedBias: the rows padded for the attention alone, packed again after)."""
    if isinstance(bias, PackedBias):
        rows = bias.packing
        out = multi_head_attention(rows.unpack(q), rows.unpack(k), rows.unpack(v), bias.bias, num_heads, scale)
        return rows.pack(out)
    return multi_head_attention(q, k, v, bias, num_heads, scale)


class MPNetEmbeddings(nn.Module):
    """Word and position embeddings and their LayerNorm; positions from PADDING_IDX + 1, padding at it."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids):
        real = input_ids.ne(PADDING_IDX).to(torch.long)
        positions = torch.cumsum(real, dim=1) * real + PADDING_IDX
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))


class SelfAttention(nn.Module):
    """`attention.attn`: q, k, v, the attention with the relative bias, and `o`."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.scale = (hidden // self.num_heads) ** -0.5
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        self.qkv = FusedProjection(self.q, self.k, self.v)

    def forward(self, x, bias):
        return self.o(attend(*self.qkv(x), bias, self.num_heads, self.scale))


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = SelfAttention(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x, bias):
        return self.LayerNorm(self.attn(x, bias) + x)


class MPNetLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config)

    def forward(self, x, bias):
        x = self.attention(x, bias)
        return self.output(self.intermediate(x), x)


class Layers(nn.Module):
    """`encoder`: the layers and the relative position bias they share."""

    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(config) for _ in range(config.num_hidden_layers))
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets,
                                                    config.num_attention_heads)
        distances = torch.arange(-MAX_DISTANCE, MAX_DISTANCE + 1)
        self.register_buffer("distance_buckets", relative_bucket(distances, True, NUM_BUCKETS, MAX_DISTANCE),
                             persistent=False)

    def scores_bias(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[B, H, S, S]: each (query, key) pair's relative bias, the dtype's minimum at padded keys (put in
        place of the bias, not added to it: in half precision minimum + bias may round to -inf, and a padded
        query's row, all masked, would then be NaN)."""
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        distance = (positions[None, :] - positions[:, None]).clamp(-MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
        by_distance = self.relative_attention_bias(self.distance_buckets)  # [2 * MAX_DISTANCE + 1, H]
        bias = by_distance[distance].permute(2, 0, 1)[None].to(dtype)  # [1, H, S, S]
        return bias.masked_fill(~padding_mask(attention_mask), torch.finfo(dtype).min)


class MPNetEncoder(EncoderStack):
    """(input_ids, attention_mask) -> the last hidden state or the head's outputs."""

    checkpoint_prefixes = ("mpnet.",)

    def __init__(self, config):
        super().__init__(config, embeddings=MPNetEmbeddings(config), encoder=Layers(config))

    def layers(self) -> nn.ModuleList:
        return self.encoder.layer

    def forward(self, input_ids, attention_mask):
        return self.encode(self.embeddings(input_ids), attention_mask)

    def forward_packed(self, input_ids, attention_mask):
        """The same graph with all but attention on the real tokens only (see the module's docstring)."""
        return self.encode_packed(self.embeddings(input_ids), attention_mask)

    def encode(self, x: torch.Tensor, attention_mask: torch.Tensor):
        bias = self.encoder.scores_bias(attention_mask, x.dtype)
        for layer in self.layers():
            x = layer(x, bias)
        return self.finish(x, attention_mask)

    def encode_packed(self, x: torch.Tensor, attention_mask: torch.Tensor):
        packing = Packing.of(attention_mask)
        bias = PackedBias(packing, self.encoder.scores_bias(attention_mask, x.dtype))
        tokens = packing.pack(x)
        for layer in self.layers():
            tokens = layer(tokens, bias)
        return self.finish(packing.unpack(tokens), attention_mask)


def mpnet_dims(config) -> Dims:
    # Positions start after the padding index, so two fewer tokens fit than the table has rows.
    dims = bert_dims(config)  # no type_vocab_size: no token types
    return dataclasses.replace(dims, max_positions=config.max_position_embeddings - PADDING_IDX - 1)


# ONNX Runtime's BERT optimizer finds no attention to fuse (it is exported fused, bias included) and fuses
# each layer's GELU; the norms are LayerNormalization nodes as exported.
FAMILY = register(
    Family(name="mpnet", model_types=("mpnet",), kind="encoder", sizes=mpnet_dims, build=MPNetEncoder,
           onnx_optimizer="bert", heads={CLASSIFY: ProjectedClassifier, SPARSE: LMHeadSplade})
)
