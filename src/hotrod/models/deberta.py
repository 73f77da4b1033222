"""DeBERTa-v2 and -v3 (model_type "deberta-v2"; mDeBERTa too): the backbone of many NLI, zero-shot and
cross-encoder checkpoints. BERT's post-norm layers around disentangled attention
(`hotrod.models.deberta_attention`).

Weight names follow transformers' DebertaV2Model (`deberta.` prefix in head checkpoints):
`embeddings.{word_embeddings, position_embeddings, token_type_embeddings, embed_proj, LayerNorm}`,
`encoder.layer.N.attention.self.{query,key,value}_proj` (and `pos_key_proj`, `pos_query_proj` without
`share_att_key`), `attention.output.{dense, LayerNorm}`, `intermediate.dense`, `output.{dense, LayerNorm}`,
`encoder.rel_embeddings` and its `encoder.LayerNorm`, `encoder.conv` (DeBERTa-v2's ConvLayer). Where it
differs from BERT:

- embeddings: absolute positions only with `position_biased_input` (v3 has none), token types only where
  `type_vocab_size` > 0 (v3 has none: its graph takes (input_ids, attention_mask),
  `hotrod.contracts.encoder_io`), a projection where `embedding_size` differs from the hidden size; after
  the LayerNorm they are multiplied by the attention mask;
- the first layer's output, where `conv_kernel_size` > 0 (DeBERTa-v2 xlarge and xxlarge), goes through the
  ConvLayer over the embeddings: a convolution along the sequence, zero at padding, its activation, the
  residual's LayerNorm, the mask;
- the classification head is ContextPooler (`pooler.dense` and `pooler_hidden_act` on the first token) then
  `classifier`; token classification (`classifier`) and question answering (`qa_outputs`) are the tasks'
  standard heads.

The packed way (`hotrod.models.packing`, the static engine's for batches with padding) runs projections,
norms and feed-forward blocks on the real tokens only, but each layer's attention on the padded rows: the
nested variable-length attention takes no bias, and here every layer's bias is per pair of positions,
computed from that layer's queries and keys. The ConvLayer, where there is one, runs on the padded rows too.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.attention import additive_mask, padding_mask
from hotrod.models.bert import DenseNorm, Intermediate
from hotrod.models.common import standard_dims
from hotrod.models.deberta_attention import DisentangledSelfAttention, PackedRows, RelativePositions, relative_span
from hotrod.models.encoder import EncoderStack
from hotrod.models.packing import Packing
from hotrod.registry import Dims, Family, register
from hotrod.tasks.constants import CLASSIFY


class DebertaEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        width = getattr(config, "embedding_size", None) or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width)
        if getattr(config, "position_biased_input", True):
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        if width != config.hidden_size:
            self.embed_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        x = self.word_embeddings(input_ids)
        if hasattr(self, "position_embeddings"):
            x = x + self.position_embeddings(torch.arange(input_ids.shape[1], device=input_ids.device)[None, :])
        if hasattr(self, "token_type_embeddings"):
            x = x + self.token_type_embeddings(token_type_ids)
        if hasattr(self, "embed_proj"):
            x = self.embed_proj(x)
        x = self.LayerNorm(x)
        return x * attention_mask[:, :, None].to(x.dtype)


class DebertaAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = DenseNorm(config.hidden_size, config)


class DebertaLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = DebertaAttention(config)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config)

    def forward(self, x, bias, relative):
        x = self.attention.output(self.attention.self(x, bias, relative), x)
        return self.output(self.intermediate(x), x)


class ConvLayer(nn.Module):
    """`encoder.conv`: over the embeddings, added to the first layer's output (see the module doc)."""

    def __init__(self, config):
        super().__init__()
        size = config.conv_kernel_size
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size, size, padding=(size - 1) // 2,
                              groups=getattr(config, "conv_groups", 1))
        self.act = ACT2FN[getattr(config, "conv_act", "tanh")]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, embeddings, residual, attention_mask):
        out = self.conv(embeddings.transpose(1, 2)).transpose(1, 2)
        out = self.act(out.masked_fill(attention_mask[:, :, None] == 0, 0))
        return self.LayerNorm(residual + out) * attention_mask[:, :, None].to(out.dtype)


class Layers(nn.Module):
    """`encoder`: the layers, the relative embeddings they share (and their LayerNorm), the ConvLayer."""

    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(DebertaLayer(config) for _ in range(config.num_hidden_layers))
        self.relative_attention = getattr(config, "relative_attention", False)
        if self.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * relative_span(config)[2], config.hidden_size)
            self.positions = RelativePositions(config)
        norms = [part.strip() for part in getattr(config, "norm_rel_ebd", "none").lower().split("|")]
        if "layer_norm" in norms:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.conv = ConvLayer(config) if getattr(config, "conv_kernel_size", 0) > 0 else None

    def relative(self, x: torch.Tensor):
        """What every layer's attention shares: None, or (the relative embeddings, c2p and p2c indices)."""
        if not self.relative_attention:
            return None
        embeddings = self.rel_embeddings.weight
        if hasattr(self, "LayerNorm"):
            embeddings = self.LayerNorm(embeddings)
        return (embeddings, *self.positions(x))


class PooledClassifier(nn.Module):
    """DeBERTa's sequence classification: `pooler` (ContextPooler: dense and `pooler_hidden_act` on the
    first token), then `classifier`."""

    def __init__(self, config):
        super().__init__()
        self.pooler = ContextPooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden, attention_mask):
        return self.classifier(self.pooler(hidden[:, 0]))


class ContextPooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        width = getattr(config, "pooler_hidden_size", config.hidden_size)
        self.dense = nn.Linear(width, width)
        self.act = ACT2FN[config.pooler_hidden_act]

    def forward(self, first):
        return self.act(self.dense(first))


class DebertaV2Encoder(EncoderStack):
    """(input_ids, attention_mask[, token_type_ids]) -> the last hidden state or the head's outputs."""

    checkpoint_prefixes = ("deberta.",)

    def __init__(self, config):
        super().__init__(config, embeddings=DebertaEmbeddings(config), encoder=Layers(config))

    def layers(self) -> nn.ModuleList:
        return self.encoder.layer

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.encode(self.embeddings(input_ids, attention_mask, token_type_ids), attention_mask)

    def forward_packed(self, input_ids, attention_mask, token_type_ids=None):
        """The same graph with all but attention on the real tokens only (see the module's docstring)."""
        return self.encode(self.embeddings(input_ids, attention_mask, token_type_ids), attention_mask, packed=True)

    def encode(self, x: torch.Tensor, attention_mask: torch.Tensor, packed: bool = False):
        seq = x.shape[1]  # the fused op wants the bias's query axis spelled out, not broadcast
        bias = additive_mask(padding_mask(attention_mask).expand(-1, -1, seq, -1), x.dtype)
        relative = self.encoder.relative(x)
        packing = Packing.of(attention_mask) if packed else None
        embeddings = x
        if packing is not None:
            x, bias = packing.pack(x), PackedRows(packing, bias)
        for index, layer in enumerate(self.layers()):
            x = layer(x, bias, relative)
            if index == 0 and self.encoder.conv is not None:
                if packing is None:
                    x = self.encoder.conv(embeddings, x, attention_mask)
                else:
                    x = packing.pack(self.encoder.conv(embeddings, packing.unpack(x), attention_mask))
        return self.finish(x if packing is None else packing.unpack(x), attention_mask)


def deberta_dims(config) -> Dims:
    """Relative positions reach any length, but `max_position_embeddings` is what the model was trained on
    (and the absolute table's size where it has one)."""
    dims = standard_dims(config, config.max_position_embeddings, type_vocab_size=config.type_vocab_size)
    head_size = getattr(config, "attention_head_size", None)
    return dataclasses.replace(dims, head_dim=head_size) if head_size else dims


# ONNX Runtime's BERT optimizer finds no attention to fuse (it is exported fused, the disentangled scores in
# its bias) and fuses each layer's GELU; the norms are LayerNormalization nodes as exported.
FAMILY = register(
    Family(name="deberta-v2", model_types=("deberta-v2",), kind="encoder", sizes=deberta_dims,
           build=DebertaV2Encoder, onnx_optimizer="bert", heads={CLASSIFY: PooledClassifier})
)
