"""The layer stack the BART-like encoder-decoders share (BART, mBART, Marian, M2M100/NLLB, Pegasus); each
family's module (`models/bart.py`, ...) registers it with a `Layout`, what sets the family apart.

All of them: token embeddings times sqrt(d_model) where the config says `scale_embedding`, plus absolute
positions (`hotrod.models.bart_positions`); layers of self-attention, (cross-attention,) and a two-layer
feed-forward with the config's activation, each sublayer around a residual and a LayerNorm, after it
(BART, Marian: post-norm) or before it with a last LayerNorm closing each stack (mBART, M2M100, Pegasus:
pre-norm); attention with biases on every projection, scaled by head_dim ** -0.5; logits from the LM head
plus `final_logits_bias` where the family has one. Weight names follow transformers'
...ForConditionalGeneration (`model.encoder.layers.0.self_attn.q_proj.weight`, `lm_head.weight`,
`final_logits_bias`). The graphs and the cache are the seq2seq kind's, as T5 runs them
(`hotrod.models.seq2seq`): cross K/V written once by the first step, self K/V in place. Without its LM head
the stack is what `hotrod.models.bart_classifier` runs whole as one graph (BartForSequenceClassification).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.attention import (
    additive_mask,
    attention_in_place,
    causal_mask,
    cross_attention,
    layers_span,
    multi_head_attention,
    padding_mask,
    split_heads,
)
from hotrod.models.common import FusedProjection, load_weights, strip_prefix
from hotrod.models.seq2seq import cross_bias, seq2seq_graphs
from hotrod.registry import Dims

HEAD_PREFIX = "classification_head."  # a ...ForSequenceClassification checkpoint's head (`bart_classifier`)


def shift_right(input_ids: torch.Tensor, config) -> torch.Tensor:
    """transformers' `shift_tokens_right` of BART: the decoder start token, then each row but its last id."""
    start = torch.full_like(input_ids[:, :1], config.decoder_start_token_id)
    return torch.cat([start, input_ids[:, :-1]], dim=1)


@dataclass(frozen=True)
class Layout:
    """What a BART-like family does its own way."""

    positions: Callable[[object, int], nn.Module]  # (config, d_model) -> a `bart_positions` module
    pre_norm: bool  # LayerNorm before each sublayer, and a last one closing each stack
    embedding_norm: bool  # `layernorm_embedding` after the embeddings
    logits_bias: bool  # `final_logits_bias` added to the logits
    # The decoder's inputs where a forward is given none (a classifier's), made from the encoder's ids and the
    # config, as transformers' ...Model.forward makes them: BART's start token then the ids shifted right.
    decoder_inputs: Callable[[torch.Tensor, object], torch.Tensor] = shift_right


def target_vocab(config) -> int:
    """The decoder's vocabulary, the logits' width: Marian's `decoder_vocab_size` where it keeps its own."""
    if getattr(config, "share_encoder_decoder_embeddings", True):
        return config.vocab_size
    return getattr(config, "decoder_vocab_size", None) or config.vocab_size


def bart_dims(config) -> Dims:
    """The decoder's heads size the caches (the encoder may have other heads: they stay inside its graph)."""
    heads = config.decoder_attention_heads
    return Dims(vocab_size=target_vocab(config), hidden_size=config.d_model, num_layers=config.encoder_layers,
                num_heads=heads, head_dim=config.d_model // heads, max_positions=config.max_position_embeddings,
                num_decoder_layers=config.decoder_layers)


class BartAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.qkv = FusedProjection(self.q_proj, self.k_proj, self.v_proj)

    def bidirectional(self, x, bias):
        """The encoder's: q, k and v the parts of one projection, as ONNX's Attention takes them."""
        q, k, v = self.qkv(x)
        return self.out_proj(multi_head_attention(q, k, v, bias, self.num_heads, self.scale))

    def with_kv(self, x, bias):
        """Over this input alone (the first decoder step); returns (output, K, V)."""
        q, k, v = self.qkv(x)
        k, v = split_heads(k, self.num_heads), split_heads(v, self.num_heads)
        return self.out_proj(multi_head_attention(q, k, v, bias, self.num_heads, self.scale)), k, v

    def in_place(self, x, past_k, past_v, seqlens_k, total_len, shared=None):
        """One step over the in-place cache buffers; returns (output, the buffers, updated)."""
        q, k, v = self.qkv(x)
        out, k, v = attention_in_place(q, k, v, past_k, past_v, seqlens_k, total_len, self.num_heads, self.scale,
                                       shared=shared)
        return self.out_proj(out), k, v

    def project_kv(self, states):
        return split_heads(self.k_proj(states), self.num_heads), split_heads(self.v_proj(states), self.num_heads)

    def cross(self, x, k, v, bias):
        return self.out_proj(cross_attention(self.q_proj(x), k, v, bias, self.num_heads, self.scale))


class _Layer(nn.Module):
    def __init__(self, config, pre_norm: bool, num_heads: int, ffn_dim: int):
        super().__init__()
        dim = config.d_model
        self.pre_norm = pre_norm
        self.self_attn = BartAttention(dim, num_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def around(self, x, norm: nn.LayerNorm, sublayer: Callable, *args):
        """x through `sublayer` with its residual and norm, before (pre-norm) or after (post-norm); returns
        (the result, what else the sublayer returned)."""
        out = sublayer(norm(x) if self.pre_norm else x, *args)
        out, extra = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
        x = x + out
        return (x if self.pre_norm else norm(x)), extra

    def feed_forward(self, x):
        return self.around(x, self.final_layer_norm, self._ffn)[0]

    def _ffn(self, x):
        return self.fc2(self.activation_fn(self.fc1(x)))


class EncoderLayer(_Layer):
    def __init__(self, config, pre_norm: bool):
        super().__init__(config, pre_norm, config.encoder_attention_heads, config.encoder_ffn_dim)

    def forward(self, x, bias):
        x, _ = self.around(x, self.self_attn_layer_norm, self.self_attn.bidirectional, bias)
        return self.feed_forward(x)


class DecoderLayer(_Layer):
    def __init__(self, config, pre_norm: bool):
        super().__init__(config, pre_norm, config.decoder_attention_heads, config.decoder_ffn_dim)
        self.encoder_attn = BartAttention(config.d_model, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model)

    def first(self, x, bias, cross, encoder_bias):
        """The first step (every position at once); returns (x, self K, self V)."""
        x, (k, v) = self.around(x, self.self_attn_layer_norm, self.self_attn.with_kv, bias)
        return self.rest(x, cross, encoder_bias), k, v

    def step(self, x, past, cross, encoder_bias, seqlens_k, total_len, shared):
        x, (k, v) = self.around(x, self.self_attn_layer_norm, self.self_attn.in_place, past[0], past[1], seqlens_k,
                                total_len, shared)
        return self.rest(x, cross, encoder_bias), k, v

    def rest(self, x, cross, encoder_bias):
        x, _ = self.around(x, self.encoder_attn_layer_norm, self.encoder_attn.cross, cross[0], cross[1], encoder_bias)
        return self.feed_forward(x)


class Stack(nn.Module):
    """One side's embeddings, layers and norms, named as in the checkpoint (`encoder.` or `decoder.`)."""

    def __init__(self, config, layout: Layout, vocab: int, layers: list[nn.Module]):
        super().__init__()
        dim = config.d_model
        self.scale = math.sqrt(dim) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.embed_positions = layout.positions(config, dim)
        if layout.embedding_norm:
            self.layernorm_embedding = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(layers)
        if layout.pre_norm:
            self.layer_norm = nn.LayerNorm(dim)

    def embed(self, input_ids, past=None):
        x = self.embed_tokens(input_ids)
        if self.scale != 1.0:
            x = x * self.scale
        x = x + self.embed_positions(input_ids, past)
        norm = getattr(self, "layernorm_embedding", None)
        return x if norm is None else norm(x)

    def close(self, x):
        norm = getattr(self, "layer_norm", None)
        return x if norm is None else norm(x)


class BartLikeModel(nn.Module):
    def __init__(self, config, layout: Layout, lm_head: bool = True):
        """`lm_head` False: the bare encoder-decoder (transformers' ...Model), without the LM head and its bias."""
        super().__init__()
        self.config = config
        self.layout = layout
        self.has_lm_head = lm_head
        vocab = target_vocab(config)
        self.encoder = Stack(config, layout, config.vocab_size,
                             [EncoderLayer(config, layout.pre_norm) for _ in range(config.encoder_layers)])
        self.decoder = Stack(config, layout, vocab,
                             [DecoderLayer(config, layout.pre_norm) for _ in range(config.decoder_layers)])
        if lm_head:
            self.lm_head = nn.Linear(config.d_model, vocab, bias=False)
        if lm_head and layout.logits_bias:
            self.final_logits_bias = nn.Parameter(torch.zeros(1, vocab))

    def encode(self, input_ids, attention_mask):
        x = self.encoder.embed(input_ids)
        seq = input_ids.shape[1]  # the fused op wants the bias's query axis spelled out, not broadcast
        bias = additive_mask(padding_mask(attention_mask).expand(-1, -1, seq, -1), x.dtype)
        for layer in self.encoder.layers:
            x = layer(x, bias)
        return self.encoder.close(x)

    def decode(self, input_ids, encoder_mask, cross):
        """Every position of `input_ids` at once, with no past (the first step, and `model(...)`);
        returns (logits, each layer's self K and V)."""
        x, present = self.decoder_states(input_ids, encoder_mask, cross)
        return self._logits(x), present

    def decoder_states(self, input_ids, encoder_mask, cross):
        """The decoder's last hidden state at every position of `input_ids` (no past), and each layer's self K
        and V: what the LM head reads, or a classification head."""
        x = self.decoder.embed(input_ids)
        length = input_ids.shape[1]
        bias = additive_mask(causal_mask(length, length, x.device), x.dtype)
        encoder_bias = cross_bias(encoder_mask, input_ids, x.dtype)  # computed once, shared by every layer
        present = []
        for layer, kv in zip(self.decoder.layers, cross):
            x, k, v = layer.first(x, bias, kv, encoder_bias)
            present += [k, v]
        return self.decoder.close(x), present

    def decode_step(self, input_ids, encoder_mask, past, cross, seqlens_k, total_len):
        """New tokens per row over the in-place self-attention cache (`past`: each layer's (k, v) buffers);
        row b's last new token is at position seqlens_k[b], the others just before it."""
        width = input_ids.shape[1]
        x = self.decoder.embed(input_ids, seqlens_k.long() + 1 - width)
        encoder_bias = cross_bias(encoder_mask, input_ids, x.dtype)
        shared = layers_span(seqlens_k, total_len, width, x.dtype)
        present = []
        for layer, kv, cache in zip(self.decoder.layers, cross, past):
            x, k, v = layer.step(x, cache, kv, encoder_bias, seqlens_k, total_len, shared)
            present += [k, v]
        return self._logits(self.decoder.close(x)), present

    def _logits(self, x):
        logits = self.lm_head(x)
        return logits + self.final_logits_bias if self.layout.logits_bias else logits

    def cross_kv(self, encoder_hidden_states):
        return [layer.encoder_attn.project_kv(encoder_hidden_states) for layer in self.decoder.layers]

    def graphs(self) -> dict[str, nn.Module]:
        return seq2seq_graphs(self)

    def load_hf(self, state_dict: dict[str, torch.Tensor]) -> None:
        """A ...ForConditionalGeneration checkpoint (or the bare model's: the head is then the embedding). A
        classifier's weights where the config names no head are refused (`hotrod.tasks.unnamed_heads`)."""
        if getattr(self, "unnamed_heads", None) is not None:
            self.unnamed_heads.check({k.removeprefix(HEAD_PREFIX) for k in state_dict if k.startswith(HEAD_PREFIX)},
                                     HEAD_PREFIX)
        state = strip_prefix(dict(state_dict), ("model.",))
        ties = self._ties()
        for source in dict.fromkeys(ties.values()):  # tied weights: whichever of them the checkpoint saved
            names = [name for name, tied in ties.items() if tied == source]
            value = next((state[key] for key in (source, *names) if key in state), None)
            if value is not None:
                state.update(dict.fromkeys(names, value))
        if hasattr(self, "final_logits_bias"):
            state.setdefault("final_logits_bias", torch.zeros_like(self.final_logits_bias))
        # A computed table is no weight: the checkpoint's where it holds one (Pegasus), else the formula's.
        sides = {side: getattr(self, side).embed_positions for side in ("encoder", "decoder")}
        tables = {side: state.pop(f"{side}.embed_positions.weight", None) for side, positions in sides.items()
                  if hasattr(positions, "load")}
        load_weights(self, state)
        for side, table in tables.items():
            sides[side].load(table)
        own = dict(self.named_parameters())
        for source in dict.fromkeys(ties.values()):  # one tensor in memory where transformers ties them
            names = [name for name, tied in ties.items() if tied == source] + ([source] if source in own else [])
            first = own[names[0]]
            for name in names[1:]:
                self.get_submodule(name.removesuffix(".weight")).weight = first

    def _ties(self) -> dict[str, str]:
        """Each embedding or head weight -> the weight transformers ties it to (none unless
        `tie_word_embeddings`): `shared` for all three, or Marian's own decoder embeddings for its head;
        without the LM head, the embeddings alone."""
        if not getattr(self.config, "tie_word_embeddings", True):
            return {}
        head = ("lm_head",) if self.has_lm_head else ()
        if getattr(self.config, "share_encoder_decoder_embeddings", True):
            return {f"{name}.weight": "shared.weight" for name in ("encoder.embed_tokens", "decoder.embed_tokens", *head)}
        return {f"{name}.weight": "decoder.embed_tokens.weight" for name in head}
