"""BERT-style encoders (bert; sentence-transformers checkpoints such as all-MiniLM-L6-v2) and their heads.

Weight names follow Hugging Face's BertModel; checkpoints of head models (`bert.` prefix) load with their
head (`hotrod.models.heads`). The encoder-kind graph is (input_ids, attention_mask, token_type_ids) ->
the last hidden state, or what the checkpoint's head makes of it.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.common import FusedProjection, standard_dims
from hotrod.models.encoder import EncoderStack, attend
from hotrod.models.heads import SpladeHead
from hotrod.registry import Dims, Family, register
from hotrod.tasks.constants import SPARSE


class BertEmbeddings(nn.Module):
    def __init__(self, config, width: int | None = None):
        """`width`: the embeddings' size where it differs from the hidden size (ELECTRA's embedding_size)."""
        super().__init__()
        width = width or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]

    def forward(self, input_ids, token_type_ids):
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(self.position_ids(input_ids))
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.scale = (hidden // self.num_heads) ** -0.5
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.qkv = FusedProjection(self.query, self.key, self.value)

    def forward(self, x, bias):
        """`bias`: the additive padding mask, or on the packed path (x [tokens, hidden]) the Packing."""
        return attend(*self.qkv(x), bias, self.num_heads, self.scale)


class DenseNorm(nn.Module):
    """Projection, residual add and LayerNorm: BERT's `*.output` modules."""

    def __init__(self, n_in: int, config):
        super().__init__()
        self.dense = nn.Linear(n_in, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = SelfAttention(config)
        self.output = DenseNorm(config.hidden_size, config)


class Intermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config)

    def forward(self, x, bias):
        x = self.attention.output(self.attention.self(x, bias), x)
        return self.output(self.intermediate(x), x)


class Layers(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertEncoder(EncoderStack):
    """(input_ids, attention_mask, token_type_ids) -> the last hidden state or the head's outputs."""

    embeddings_class = BertEmbeddings
    checkpoint_prefixes = ("bert.",)

    def __init__(self, config):
        super().__init__(config, embeddings=self.embeddings_class(config), encoder=Layers(config))

    def layers(self) -> nn.ModuleList:
        return self.encoder.layer

    def embed(self, input_ids, token_type_ids):
        """The first layer's input [B, S, H]."""
        return self.embeddings(input_ids, token_type_ids)

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.encode(self.embed(input_ids, token_type_ids), attention_mask)

    def forward_packed(self, input_ids, attention_mask, token_type_ids):
        """The same graph with every layer on the real tokens only (`hotrod.models.packing`)."""
        return self.encode_packed(self.embed(input_ids, token_type_ids), attention_mask)


def bert_dims(config) -> Dims:
    """The sizes of a config with BERT's field names (a config without token types has none)."""
    return standard_dims(config, config.max_position_embeddings, type_vocab_size=getattr(config, "type_vocab_size", 0))


class _Transform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]  # the config's activation, as BertPredictionHeadTransform's
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.act(self.dense(x)))


class _Predictions(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transform = _Transform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # tied to the word embeddings
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))


class _OnlyMLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.predictions = _Predictions(config)


class BertSplade(SpladeHead):
    """BertForMaskedLM's head (`cls.predictions`: transform.dense, the config's activation, transform.LayerNorm,
    decoder + bias) run as SPLADE (`SpladeHead`)."""

    def __init__(self, config):
        super().__init__(config, "cls.predictions.decoder.weight")
        self.cls = _OnlyMLM(config)

    def logits(self, hidden):
        predictions = self.cls.predictions
        return predictions.decoder(predictions.transform(hidden)) + predictions.bias


FAMILY = register(
    Family(name="bert", model_types=("bert",), kind="encoder", sizes=bert_dims, build=BertEncoder,
           onnx_optimizer="bert", heads={SPARSE: BertSplade})
)
