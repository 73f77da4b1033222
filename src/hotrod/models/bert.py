"""BERT-style encoders (bert; sentence-transformers checkpoints such as all-MiniLM-L6-v2) and their heads.

Weight names follow Hugging Face's BertModel; checkpoints of head models (`bert.` prefix) load with their
head (`hotrod.models.heads`). The encoder-kind graph is (input_ids, attention_mask, token_type_ids) ->
the last hidden state, or what the checkpoint's head makes of it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.common import (
    FusedProjection,
    additive_mask,
    multi_head_attention,
    padding_mask,
)
from hotrod.models.heads import STANDARD_HEADS, Head, build_head, load_with_head
from hotrod.models.packing import Packing, packed_attention
from hotrod.registry import Dims, Family, register
from hotrod.tasks import ENCODER_TASKS


class BertEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

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
        q, k, v = self.qkv(x)
        if isinstance(bias, Packing):
            return packed_attention(q, k, v, bias, self.num_heads, self.scale)
        return multi_head_attention(q, k, v, bias, self.num_heads, self.scale)


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


class BertEncoder(nn.Module):
    """The encoder-kind graph: (input_ids, attention_mask, token_type_ids) -> last_hidden_state, or the
    outputs of the head the checkpoint's task names (`heads`)."""

    embeddings_class = BertEmbeddings
    checkpoint_prefixes = ("bert.",)
    heads: dict[str, Head] = STANDARD_HEADS

    def __init__(self, config):
        super().__init__()
        self.embeddings = self.embeddings_class(config)
        self.encoder = Layers(config)
        self.num_labels = config.num_labels
        self.head = build_head(config, self.heads)

    def forward(self, input_ids, attention_mask, token_type_ids):
        x = self.embeddings(input_ids, token_type_ids)
        seq = input_ids.shape[1]  # the fused op wants the bias's query axis spelled out, not broadcast
        bias = additive_mask(padding_mask(attention_mask).expand(-1, -1, seq, -1), x.dtype)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return self.finish(x, attention_mask)

    def forward_packed(self, input_ids, attention_mask, token_type_ids):
        """The same graph with every layer on the real tokens only (`hotrod.models.packing`): equal to
        `forward` at real positions, zeros at padded ones."""
        packing = Packing.of(attention_mask)
        tokens = packing.pack(self.embeddings(input_ids, token_type_ids))
        for layer in self.encoder.layer:
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


def bert_dims(config) -> Dims:
    """The sizes of a config with BERT's field names (a config without token types has none)."""
    return Dims(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        max_positions=config.max_position_embeddings,
        type_vocab_size=getattr(config, "type_vocab_size", 0),
    )


FAMILY = register(
    Family(name="bert", model_types=("bert",), kind="encoder", sizes=bert_dims, build=BertEncoder,
           onnx_optimizer="bert", tasks=ENCODER_TASKS)
)
