"""DistilBERT: BERT's post-norm layers under other names, over word and position embeddings only.

It has no token types, so its graph takes (input_ids, attention_mask) (`hotrod.contracts.encoder_io`
with type_vocab_size 0). Weight names follow transformers' DistilBertModel (`distilbert.` prefix in head
checkpoints): `transformer.layer.N.attention.{q,k,v,out}_lin`, `sa_layer_norm`, `ffn.lin1/lin2`,
`output_layer_norm`. Its norms' epsilon is fixed at 1e-12, as transformers builds them.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.common import FusedProjection, standard_dims
from hotrod.models.encoder import EncoderStack, attend
from hotrod.models.heads import PreClassifier, SpladeHead
from hotrod.registry import Dims, Family, register
from hotrod.tasks.constants import CLASSIFY, SPARSE

EPS = 1e-12


class Embeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.dim)
        self.LayerNorm = nn.LayerNorm(config.dim, eps=EPS)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))


class SelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.n_heads
        self.scale = (config.dim // config.n_heads) ** -0.5
        self.q_lin = nn.Linear(config.dim, config.dim)
        self.k_lin = nn.Linear(config.dim, config.dim)
        self.v_lin = nn.Linear(config.dim, config.dim)
        self.out_lin = nn.Linear(config.dim, config.dim)
        self.qkv = FusedProjection(self.q_lin, self.k_lin, self.v_lin)

    def forward(self, x, bias):
        return self.out_lin(attend(*self.qkv(x), bias, self.num_heads, self.scale))


class FFN(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.lin1 = nn.Linear(config.dim, config.hidden_dim)
        self.lin2 = nn.Linear(config.hidden_dim, config.dim)
        self.act = ACT2FN[config.activation]

    def forward(self, x):
        return self.lin2(self.act(self.lin1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = SelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=EPS)
        self.ffn = FFN(config)
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=EPS)

    def forward(self, x, bias):
        x = self.sa_layer_norm(self.attention(x, bias) + x)
        return self.output_layer_norm(self.ffn(x) + x)


class Transformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))


class DistilBertEncoder(EncoderStack):
    """(input_ids, attention_mask) -> the last hidden state or the head's outputs."""

    checkpoint_prefixes = ("distilbert.",)

    def __init__(self, config):
        super().__init__(config, embeddings=Embeddings(config), transformer=Transformer(config))

    def layers(self) -> nn.ModuleList:
        return self.transformer.layer

    def forward(self, input_ids, attention_mask):
        return self.encode(self.embeddings(input_ids), attention_mask)

    def forward_packed(self, input_ids, attention_mask):
        """The same graph with every layer on the real tokens only (`hotrod.models.packing`)."""
        return self.encode_packed(self.embeddings(input_ids), attention_mask)


def distilbert_dims(config) -> Dims:
    return standard_dims(config, config.max_position_embeddings)  # no token types: type_vocab_size 0


class DistilBertSplade(SpladeHead):
    """DistilBertForMaskedLM's head (vocab_transform, the config's activation, vocab_layer_norm,
    vocab_projector) run as SPLADE (`SpladeHead`)."""

    def __init__(self, config):
        super().__init__(config, "vocab_projector.weight")
        self.vocab_transform = nn.Linear(config.dim, config.dim)
        self.act = ACT2FN[config.activation]
        self.vocab_layer_norm = nn.LayerNorm(config.dim, eps=EPS)
        self.vocab_projector = nn.Linear(config.dim, config.vocab_size)

    def logits(self, hidden):
        return self.vocab_projector(self.vocab_layer_norm(self.act(self.vocab_transform(hidden))))


FAMILY = register(
    Family(name="distilbert", model_types=("distilbert",), kind="encoder", sizes=distilbert_dims,
           build=DistilBertEncoder, onnx_optimizer="bert",
           heads={CLASSIFY: PreClassifier, SPARSE: DistilBertSplade})
)
