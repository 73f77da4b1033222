"""GPT-2 (gpt2, distilgpt2, gpt2-medium/large/xl): a decoder-only LM with learned absolute positions.

Weight names follow Hugging Face's GPT2LMHeadModel (`transformer.h.0.attn.c_attn.weight`, ...), with
the LM head tied to the token embedding.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.attention import attention_in_place, layers_span
from hotrod.models.common import Conv1D, load_weights, rows_at, standard_dims
from hotrod.registry import Dims, Family, register


class GPT2Attention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.c_attn = Conv1D(hidden, 3 * hidden)
        self.c_proj = Conv1D(hidden, hidden)
        self.scale = (hidden // self.num_heads) ** -0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scale /= float(layer_idx + 1)

    def forward(self, x, lengths, past_k, past_v, shared=None):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)  # c_attn is already one fused QKV projection
        out, k, v = attention_in_place(q, k, v, past_k, past_v, *lengths, self.num_heads, self.scale, shared=shared)
        return self.c_proj(out), k, v


class GPT2MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        inner = config.n_inner or 4 * config.hidden_size
        self.c_fc = Conv1D(config.hidden_size, inner)
        self.c_proj = Conv1D(inner, config.hidden_size)
        self.act = ACT2FN[config.activation_function]

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        eps = config.layer_norm_epsilon
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = GPT2MLP(config)

    def forward(self, x, lengths, past_k, past_v, shared=None):
        attn, k, v = self.attn(self.ln_1(x), lengths, past_k, past_v, shared)
        x = x + attn
        return x + self.mlp(self.ln_2(x)), k, v


class GPT2Body(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.n_positions, config.hidden_size)
        self.h = nn.ModuleList(GPT2Block(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)


class GPT2LM(nn.Module):
    """The decoder-kind graph (`hotrod.contracts.decoder_io`):
    (input_ids, position_ids, seqlens_k, total_sequence_length, logits_positions, *cache) -> (logits, *cache).

    The cache buffers are written in place at each row's length; logits are computed only at
    `logits_positions` (the last real token of each row when generating), not for every prompt token.
    """

    def __init__(self, config):
        super().__init__()
        self.transformer = GPT2Body(config)

    def forward(self, input_ids, position_ids, seqlens_k, total_sequence_length, logits_positions, *past):
        body = self.transformer
        x = body.wte(input_ids) + body.wpe(position_ids)
        shared = layers_span(seqlens_k, total_sequence_length, input_ids.shape[1], x.dtype)  # one mask, every layer
        present = []
        for i, block in enumerate(body.h):
            x, k, v = block(x, (seqlens_k, total_sequence_length), past[2 * i], past[2 * i + 1], shared)
            present += [k, v]
        logits = torch.matmul(body.ln_f(rows_at(x, logits_positions)), body.wte.weight.t())
        return (logits, *present)

    def graphs(self) -> dict[str, nn.Module]:
        return {"decoder": self}

    def load_hf(self, state_dict: dict[str, torch.Tensor]) -> None:
        if not any(key.startswith("transformer.") for key in state_dict):  # a bare GPT2Model checkpoint
            state_dict = {f"transformer.{key}": value for key, value in state_dict.items()}
        load_weights(self, state_dict)


def gpt2_dims(config) -> Dims:
    return standard_dims(config, config.n_positions)


FAMILY = register(Family(name="gpt2", model_types=("gpt2",), kind="decoder", sizes=gpt2_dims, build=GPT2LM,
                         onnx_optimizer="gpt2"))
