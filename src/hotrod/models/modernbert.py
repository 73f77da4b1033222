"""ModernBERT: a pre-norm encoder with rotary positions, GeGLU feed-forward blocks and alternating global
and local (sliding-window) attention, and its heads.

Weight names follow transformers' ModernBertModel; head checkpoints (`model.` prefix) load with their
head (`hotrod.models.heads.load_with_head`). There is no token type embedding, so the encoder-kind graph
is (input_ids, attention_mask) -> the last hidden state, or what the checkpoint's head makes of it.

A local layer lets each token attend only to the tokens within `local_attention // 2` positions of its
own, both ways. That window is one more boolean term of the layer's attention mask, so a local layer's
attention is the same fused attention node as a global layer's, with another additive bias: the graph
keeps one attention op for every layer. Rotary embeddings turn the queries and keys at positions 0 .. S-1
of each row, with the base of the layer's type (`rope_parameters`), as one node each
(`hotrod.models.rotary.RotaryEmbedding`).

There is no padding-free (`packed_graphs`) way through this family: the packed path's attention runs on
nested variable-length rows, which take no mask, and a sliding window is a mask. Without `packed_graphs`
the static engine runs every batch the padded way (`hotrod.runtime.static`), as it does on a CPU anyway.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.errors import HotrodError
from hotrod.models.attention import additive_mask, multi_head_attention, padding_mask
from hotrod.models.bert import bert_dims
from hotrod.models.heads import load_with_head
from hotrod.models.rotary import RotaryEmbedding
from hotrod.registry import Dims, Family, register, registered
from hotrod.tasks import build_head, unnamed_heads
from hotrod.tasks.constants import ANSWER, CLASSIFY, TOKENS

GLOBAL = "full_attention"
LOCAL = "sliding_attention"


def _norm(config) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    """Token embeddings and their LayerNorm: no position or token type table."""

    def __init__(self, config):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = _norm(config)

    def forward(self, input_ids):
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.scale = (self.hidden // self.num_heads) ** -0.5
        self.Wqkv = nn.Linear(self.hidden, 3 * self.hidden, bias=config.attention_bias)
        self.Wo = nn.Linear(self.hidden, self.hidden, bias=config.attention_bias)

    def forward(self, x, bias, rotary):
        q, k, v = self.Wqkv(x).split(self.hidden, dim=-1)
        q, k = rotary(q, self.num_heads), rotary(k, self.num_heads)
        return self.Wo(multi_head_attention(q, k, v, bias, self.num_heads, self.scale))


class ModernBertMLP(nn.Module):
    """GeGLU: `Wi` makes the input and its gate side by side; act(input) * gate, then `Wo`."""

    def __init__(self, config):
        super().__init__()
        self.width = config.intermediate_size
        self.Wi = nn.Linear(config.hidden_size, 2 * self.width, bias=config.mlp_bias)
        self.act = ACT2FN[config.hidden_activation]
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x):
        value, gate = self.Wi(x).split(self.width, dim=-1)  # sizes known: one Split node
        return self.Wo(self.act(value) * gate)


class ModernBertLayer(nn.Module):
    """Pre-norm: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)); the first layer's input is the
    embeddings' own LayerNorm, so its `attn_norm` is the identity."""

    def __init__(self, config, index: int):
        super().__init__()
        self.attention_type = config.layer_types[index]
        self.attn_norm = nn.Identity() if index == 0 else _norm(config)
        self.attn = ModernBertAttention(config)
        self.mlp_norm = _norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, x, bias, rotary):
        x = x + self.attn(self.attn_norm(x), bias, rotary)
        return x + self.mlp(self.mlp_norm(x))


class PredictionHead(nn.Module):
    """`head`: dense, activation and LayerNorm, ahead of every ModernBERT classifier."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACT2FN[config.classifier_activation]
        self.norm = _norm(config)

    def forward(self, x):
        return self.norm(self.act(self.dense(x)))


def mean_over_mask(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S, H] -> [B, H]: the mean over each row's real tokens."""
    mask = attention_mask.to(hidden.dtype)
    return (hidden * mask[..., None]).sum(dim=1) / mask.sum(dim=1, keepdim=True)


class PooledHeadClassifier(nn.Module):
    """Sequence classification: the first token or the mean of the real ones (`classifier_pooling`), then
    `head` and `classifier`."""

    def __init__(self, config):
        super().__init__()
        self.mean = config.classifier_pooling == "mean"
        self.head = PredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden, attention_mask):
        pooled = mean_over_mask(hidden, attention_mask) if self.mean else hidden[:, 0]
        return self.classifier(self.head(pooled))


class TokenHeadClassifier(nn.Module):
    """Token classification: `head` and `classifier` on every token."""

    def __init__(self, config, outputs: int | None = None):
        super().__init__()
        self.head = PredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels if outputs is None else outputs)

    def forward(self, hidden, attention_mask):
        return self.classifier(self.head(hidden))


class SpanHeadClassifier(TokenHeadClassifier):
    """Question answering: the token head with two outputs, split into start and end logits."""

    def __init__(self, config):
        super().__init__(config, outputs=2)

    def forward(self, hidden, attention_mask):
        start, end = super().forward(hidden, attention_mask).unbind(dim=-1)
        return start, end


class ModernBertEncoder(nn.Module):
    """The encoder-kind graph: (input_ids, attention_mask) -> last_hidden_state, or the outputs of the
    head the checkpoint's task names (the family's `heads`)."""

    checkpoint_prefixes = ("model.",)

    def __init__(self, config):
        super().__init__()
        head_dim = config.hidden_size // config.num_attention_heads
        self.rotary = nn.ModuleDict({kind: RotaryEmbedding(head_dim, theta, config.max_position_embeddings)
                                     for kind, theta in rope_thetas(config).items()})
        self.window = config.local_attention // 2
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = _norm(config)
        self.num_labels = config.num_labels
        self.head = build_head(config, registered(config.model_type))
        self.unnamed_heads = unnamed_heads(config, registered(config.model_type))  # `load_with_head` asks

    def forward(self, input_ids, attention_mask):
        x = self.embeddings(input_ids)
        biases = self.biases(attention_mask, x.dtype)
        for layer in self.layers:
            x = layer(x, biases[layer.attention_type], self.rotary[layer.attention_type])
        x = self.final_norm(x)
        return x if self.head is None else self.head(x, attention_mask)

    def biases(self, attention_mask, dtype) -> dict[str, torch.Tensor]:
        """Each attention type's additive mask [B, 1, S, S]: a global layer's keys are the real tokens, a local
        layer's the real tokens within the window of the query's position."""
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        keys = padding_mask(attention_mask).expand(-1, -1, positions.shape[0], -1)  # the query axis spelled out
        near = (positions[:, None] - positions[None, :]).abs() <= self.window
        allowed = {GLOBAL: keys, LOCAL: keys & near}
        return {kind: additive_mask(allowed[kind], dtype) for kind in self.rotary}

    def graphs(self) -> dict[str, nn.Module]:
        return {"encoder": self}

    def load_hf(self, state_dict: dict[str, torch.Tensor]) -> None:
        load_with_head(self, state_dict, self.checkpoint_prefixes)


def rope_thetas(config) -> dict[str, float]:
    """Each attention type's rotary base (`rope_parameters`): global and local layers have their own. Only
    plain rotary embeddings are run; a scaled variant is refused by name."""
    thetas = {}
    for kind in sorted(set(config.layer_types)):
        if kind not in (GLOBAL, LOCAL):
            raise HotrodError(f"unknown ModernBERT layer type {kind!r}; hotrod runs {GLOBAL} and {LOCAL}")
        params = config.rope_parameters[kind]
        if params.get("rope_type", "default") != "default":
            raise HotrodError(f"hotrod's modernbert family runs default rotary embeddings, not {params['rope_type']!r}")
        thetas[kind] = float(params["rope_theta"])
    return thetas


def modernbert_dims(config) -> Dims:
    rope_thetas(config)  # a layer type or rotary variant hotrod does not run is refused when the config is read
    return bert_dims(config)


# ONNX Runtime's BERT optimizer finds nothing of attention or rotary embeddings to fuse (both are exported
# fused), and needs not: it fuses the GELU of each feed-forward block and folds the shape arithmetic.
FAMILY = register(
    Family(name="modernbert", model_types=("modernbert",), kind="encoder", sizes=modernbert_dims,
           build=ModernBertEncoder, onnx_optimizer="bert",
           heads={CLASSIFY: PooledHeadClassifier, TOKENS: TokenHeadClassifier, ANSWER: SpanHeadClassifier})
)
