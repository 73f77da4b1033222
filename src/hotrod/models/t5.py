"""T5 (original t5, and t5 v1.1 / flan-t5 / mT5: gated-gelu feed-forward, untied LM head, unequal depths).

Weight names follow Hugging Face's T5ForConditionalGeneration. Three graphs, as the seq2seq kind asks:
the encoder; the first decoder step, which also returns each layer's cross-attention K/V (computed
once from the encoder output); and the decoder step with past, which reuses them.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.attention import (
    additive_mask,
    attention_in_place,
    causal_mask,
    cross_attention,
    key_positions,
    layers_span,
    multi_head_attention,
    padding_mask,
    split_heads,
)
from hotrod.models.common import FusedProjection, load_weights
from hotrod.models.seq2seq import cross_bias, seq2seq_graphs
from hotrod.registry import Dims, Family, register

# Kept in fp32 under half precision, beyond what every graph keeps:
T5_FP32_OPS = (
    "Relu",  # the feed-forward activation: when the search keeps wi or wo, the path through it stays fp32
    "Log",  # relative-position buckets: half rounding of log(distance) moves a distance to the next bucket
)


class T5LayerNorm(nn.Module):
    """RMS norm without mean or bias, accumulated in fp32 as T5 expects."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.fused = False  # see `fewer_kernels`

    def forward(self, x):
        if self.fused:
            return torch.nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(self.weight.dtype)

    def fewer_kernels(self, dtype: torch.dtype) -> None:
        """On the static engine in half precision: torch's fused RMS norm (one kernel where the formula
        above takes eight; it too accumulates in fp32, but rounds once where the formula rounds twice).
        fp32 keeps the formula, transformers' own, for token identity."""
        self.fused = dtype != torch.float32


def relative_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int):
    """Mesh TensorFlow's bucketing of (key - query) distances, identical to Hugging Face's."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).to(torch.long) * num_buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    large = max_exact + (
        torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


class T5Attention(nn.Module):
    def __init__(self, config, has_bias: bool, bidirectional: bool):
        super().__init__()
        inner = config.num_heads * config.d_kv
        self.num_heads = config.num_heads
        self.q = nn.Linear(config.d_model, inner, bias=False)
        self.k = nn.Linear(config.d_model, inner, bias=False)
        self.v = nn.Linear(config.d_model, inner, bias=False)
        self.o = nn.Linear(inner, config.d_model, bias=False)
        self.qkv = FusedProjection(self.q, self.k, self.v)
        self.bidirectional = bidirectional
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        if has_bias:
            self.relative_attention_bias = nn.Embedding(self.num_buckets, config.num_heads)
            if not bidirectional:  # the bucket of each distance back, up to where the buckets stop changing
                distances = -torch.arange(self.max_distance + 1)
                self.register_buffer("distance_buckets", relative_bucket(
                    distances, False, self.num_buckets, self.max_distance), persistent=False)

    def position_bias(self, query_len, key_len, device) -> torch.Tensor:
        """[1, H, Sq, Sk]; queries are the last Sq of the Sk positions (past tokens come first)."""
        q_pos = torch.arange(query_len, device=device)[:, None] + (key_len - query_len)
        k_pos = torch.arange(key_len, device=device)[None, :]
        bucket = relative_bucket(k_pos - q_pos, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)

    def step_position_bias(self, seqlens_k, total_len, query_len) -> torch.Tensor:
        """[B, H, Sq, total]: each row's Sq new queries end at its own position seqlens_k[b] (one token when
        decoding; a token and its draft when verifying), as the in-place attention places them."""
        queries = seqlens_k.long()[:, None] - (query_len - 1) + torch.arange(query_len, device=seqlens_k.device)
        relative = key_positions(total_len, seqlens_k.device)[None, None, :] - queries[:, :, None]
        if not self.bidirectional:
            # A decoder's bucket depends on the distance back alone, and is the last one from `max_distance`
            # on: a table of the bias at each distance (constant, folded when the graph loads) read by
            # distance takes a step's graph a dozen nodes where the bucketing takes three dozen, the same
            # values (the buckets come from the same function).
            table = self.relative_attention_bias(self.distance_buckets)
            return table[(-relative).clamp(0, self.max_distance)].permute(0, 3, 1, 2)
        bucket = relative_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(bucket).permute(0, 3, 1, 2)

    def project_kv(self, states):
        return split_heads(self.k(states), self.num_heads), split_heads(self.v(states), self.num_heads)

    def self_attention(self, x, bias):
        """Returns (output, K, V) over this input alone (the encoder, the first decoder step)."""
        q, k, v = self.qkv(x)
        k, v = split_heads(k, self.num_heads), split_heads(v, self.num_heads)
        return self.o(multi_head_attention(q, k, v, bias, self.num_heads, 1.0)), k, v

    def self_attention_in_place(self, x, past_k, past_v, seqlens_k, total_len, bias, shared=None):
        """One step over the in-place cache buffers; returns (output, the buffers, updated)."""
        q, k, v = self.qkv(x)
        out, k, v = attention_in_place(q, k, v, past_k, past_v, seqlens_k, total_len, self.num_heads, 1.0, bias,
                                       shared=shared)
        return self.o(out), k, v

    def cross_attention(self, x, k, v, bias):
        return self.o(cross_attention(self.q(x), k, v, bias, self.num_heads, 1.0))


class T5LayerFF(nn.Module):
    def __init__(self, config):
        super().__init__()
        gated = config.is_gated_act
        self.DenseReluDense = (GatedFF if gated else DenseFF)(config)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)

    def forward(self, x):
        return x + self.DenseReluDense(self.layer_norm(x))


class DenseFF(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.act = ACT2FN[config.dense_act_fn]

    def forward(self, x):
        return self.wo(self.act(self.wi(x)))


class GatedFF(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.act = ACT2FN[config.dense_act_fn]

    def forward(self, x):
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


class SelfAttentionLayer(nn.Module):
    def __init__(self, config, has_bias: bool, bidirectional: bool):
        super().__init__()
        self.SelfAttention = T5Attention(config, has_bias, bidirectional)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)


class CrossAttentionLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.EncDecAttention = T5Attention(config, False, False)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)


class T5Block(nn.Module):
    """`layer` holds [self-attention, (cross-attention,) feed-forward], as in the checkpoint."""

    def __init__(self, config, has_bias: bool, is_decoder: bool):
        super().__init__()
        layers = [SelfAttentionLayer(config, has_bias, bidirectional=not is_decoder)]
        if is_decoder:
            layers.append(CrossAttentionLayer(config))
        layers.append(T5LayerFF(config))
        self.layer = nn.ModuleList(layers)

    def self_attention(self, x, bias):
        layer = self.layer[0]
        out, k, v = layer.SelfAttention.self_attention(layer.layer_norm(x), bias)
        return x + out, k, v

    def self_attention_in_place(self, x, past_k, past_v, seqlens_k, total_len, bias, shared=None):
        layer = self.layer[0]
        out, k, v = layer.SelfAttention.self_attention_in_place(layer.layer_norm(x), past_k, past_v, seqlens_k,
                                                                total_len, bias, shared)
        return x + out, k, v

    def cross_attention(self, x, cross_k, cross_v, bias):
        layer = self.layer[1]
        return x + layer.EncDecAttention.cross_attention(layer.layer_norm(x), cross_k, cross_v, bias)


class T5Stack(nn.Module):
    def __init__(self, config, num_layers: int, is_decoder: bool):
        super().__init__()
        self.block = nn.ModuleList(T5Block(config, i == 0, is_decoder) for i in range(num_layers))
        self.final_layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)

    def bias(self, query_len, key_len, device):
        return self.block[0].layer[0].SelfAttention.position_bias(query_len, key_len, device)


class T5Model(nn.Module):
    def __init__(self, config, rescale_output: bool | None = None):
        super().__init__()
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config, config.num_layers, is_decoder=False)
        self.decoder = T5Stack(config, config.num_decoder_layers, is_decoder=True)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        # Original T5 ties the head to the embedding and rescales the decoder output; v1.1 does neither.
        if rescale_output is None:
            rescale_output = _scales_decoder_output(config)
        self.output_scale = config.d_model**-0.5 if rescale_output else 1.0

    def encode(self, input_ids, attention_mask):
        x = self.shared(input_ids)
        seq = input_ids.shape[1]
        # Position bias [1, H, S, S] plus the padding mask [B, 1, 1, S]: one additive bias for every layer.
        bias = self.encoder.bias(seq, seq, x.device) + additive_mask(padding_mask(attention_mask), x.dtype)
        for block in self.encoder.block:
            x, _, _ = block.self_attention(x, bias)
            x = block.layer[-1](x)
        return self.encoder.final_layer_norm(x)

    def decode(self, input_ids, encoder_mask, cross):
        """Every position of `input_ids` at once, with no past (the first step, and `model(...)`);
        returns (logits, each layer's self K and V)."""
        x = self.shared(input_ids)
        length = input_ids.shape[1]
        bias = self.decoder.bias(length, length, x.device) + additive_mask(causal_mask(length, length, x.device))
        encoder_bias = cross_bias(encoder_mask, input_ids, x.dtype)  # computed once, shared by every layer
        present = []
        for i, block in enumerate(self.decoder.block):
            x, k, v = block.self_attention(x, bias)
            x = self._rest_of_block(block, x, cross[i], encoder_bias)
            present += [k, v]
        return self._logits(x), present

    def decode_step(self, input_ids, encoder_mask, past, cross, seqlens_k, total_len):
        """New tokens per row over the in-place self-attention cache (`past`: each layer's (k, v) buffers).

        Rows keep their own lengths, so rows that joined a running batch at different steps need no
        padding: row b's last new token is at position seqlens_k[b], its relative position bias computed
        there (and the tokens before it, when a draft is verified, just before).
        """
        x = self.shared(input_ids)
        bias = self.decoder.block[0].layer[0].SelfAttention.step_position_bias(seqlens_k, total_len,
                                                                              input_ids.shape[1])
        encoder_bias = cross_bias(encoder_mask, input_ids, x.dtype)
        shared = layers_span(seqlens_k, total_len, input_ids.shape[1], x.dtype, bias)  # position bias folded in
        present = []
        for i, block in enumerate(self.decoder.block):
            x, k, v = block.self_attention_in_place(x, past[i][0], past[i][1], seqlens_k, total_len, bias, shared)
            x = self._rest_of_block(block, x, cross[i], encoder_bias)
            present += [k, v]
        return self._logits(x), present

    @staticmethod
    def _rest_of_block(block, x, cross, cross_bias):
        return block.layer[-1](block.cross_attention(x, cross[0], cross[1], cross_bias))

    def _logits(self, x):
        return self.lm_head(self.decoder.final_layer_norm(x) * self.output_scale)

    def cross_kv(self, encoder_hidden_states):
        return [block.layer[1].EncDecAttention.project_kv(encoder_hidden_states) for block in self.decoder.block]

    def graphs(self) -> dict[str, nn.Module]:
        return seq2seq_graphs(self)

    def load_hf(self, state_dict: dict[str, torch.Tensor]) -> None:
        state_dict = dict(state_dict)
        state_dict.setdefault("lm_head.weight", state_dict.get("shared.weight"))
        if state_dict["lm_head.weight"] is None:
            state_dict.pop("lm_head.weight")
        load_weights(self, state_dict)


def _scales_decoder_output(config) -> bool:
    scale = getattr(config, "scale_decoder_outputs", None)  # transformers >= 5 keeps the original flag here
    return bool(config.tie_word_embeddings if scale is None else scale)


def t5_dims(config) -> Dims:
    return Dims(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        head_dim=config.d_kv,
        max_positions=None,
        num_decoder_layers=config.num_decoder_layers,
    )


def mt5_model(config) -> T5Model:
    """mT5 is T5 v1.1 in layout; its decoder output is never rescaled, whatever its config says of tying."""
    return T5Model(config, rescale_output=False)


FAMILY = register(
    Family(name="t5", model_types=("t5",), kind="seq2seq", sizes=t5_dims, build=T5Model, onnx_optimizer="t5",
           fp32_ops=T5_FP32_OPS)
)
MT5 = register(
    Family(name="mt5", model_types=("mt5",), kind="seq2seq", sizes=t5_dims, build=mt5_model, onnx_optimizer="t5",
           fp32_ops=T5_FP32_OPS)
)
