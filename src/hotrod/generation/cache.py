"""Decoding state per kind: the attention mask and the backend's KV-cache handles.

A state turns the kind's graph contract into three calls the decoding loop needs: `start` (prefill,
or encode and first decoder step), `step` (one token per row) and `reorder` (beam search). The cache
stays as backend handles throughout; only the last-position logits come back as torch tensors.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hotrod.export.io import kv_names
from hotrod.registry import Dims
from hotrod.runtime.base import Backend


class DecodingState(Protocol):
    sequences_include_prompt: bool  # rows start with the prompt (decoder-only) or a start token (seq2seq)

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, expand: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (initial sequences, next-token logits), each row repeated `expand` times."""

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; returns next-token logits [rows, vocab]."""

    def reorder(self, index: torch.Tensor) -> None:
        """Rows of the cache become rows `index` of the old cache (beams within one prompt)."""


def _expand_index(rows: int, expand: int) -> torch.Tensor:
    return torch.arange(rows).repeat_interleave(expand)


def empty_past(dims: Dims, layers: int, batch: int) -> dict[str, torch.Tensor]:
    shape = (batch, dims.num_heads, 0, dims.head_dim)
    return {name: torch.zeros(shape) for name in kv_names("past_key_values", layers)}


def generation_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them (as transformers)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


class DecoderState:
    """Decoder-only: one graph, prefill with an empty past, then one token at a time."""

    sequences_include_prompt = True

    def __init__(self, backend: Backend, dims: Dims):
        self.backend = backend
        self.dims = dims
        self.present = kv_names("present", dims.num_layers)
        self.past = kv_names("past_key_values", dims.num_layers)
        self.cache: list[Any] = []

    def start(self, input_ids, attention_mask, expand):
        positions = generation_positions(attention_mask)
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions}
        feeds.update(empty_past(self.dims, self.dims.num_layers, input_ids.shape[0]))
        out = self.backend.run("decoder", feeds)
        logits = self.backend.to_torch(out["logits"])[:, -1].float()
        self.cache = [out[name] for name in self.present]
        self.mask = attention_mask
        self.next_position = positions[:, -1:] + 1
        if expand > 1:
            index = _expand_index(input_ids.shape[0], expand)
            self.reorder(index)
            input_ids, logits = input_ids[index], logits[index]
        return input_ids, logits

    def step(self, tokens):
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        feeds = {"input_ids": tokens[:, None], "attention_mask": self.mask, "position_ids": self.next_position}
        feeds.update(zip(self.past, self.cache))
        out = self.backend.run("decoder", feeds)
        self.cache = [out[name] for name in self.present]
        self.next_position = self.next_position + 1
        return self.backend.to_torch(out["logits"])[:, -1].float()

    def reorder(self, index):
        self.cache = [self.backend.select(value, index) for value in self.cache]
        self.mask = self.mask[index]
        self.next_position = self.next_position[index]


class Seq2SeqState:
    """Encoder-decoder: encode once, first step returns the cross-attention K/V, then step with past."""

    sequences_include_prompt = False

    def __init__(self, backend: Backend, dims: Dims, decoder_start_token_id: int):
        self.backend = backend
        self.start_token = decoder_start_token_id
        layers = dims.num_decoder_layers
        self.present = kv_names("present", layers)
        self.past = kv_names("past_key_values", layers)
        self.cross_names = kv_names("cross", layers)
        self.cache: list[Any] = []
        self.cross: list[Any] = []

    def start(self, input_ids, attention_mask, expand):
        hidden = self.backend.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        hidden = hidden["encoder_hidden_states"]
        if expand > 1:
            index = _expand_index(input_ids.shape[0], expand)
            hidden, attention_mask = self.backend.select(hidden, index), attention_mask[index]
        self.mask = attention_mask
        sequences = torch.full((attention_mask.shape[0], 1), self.start_token, dtype=torch.long)
        out = self.backend.run(
            "decoder_init",
            {"decoder_input_ids": sequences, "encoder_attention_mask": self.mask, "encoder_hidden_states": hidden},
        )
        self.cache = [out[name] for name in self.present]
        self.cross = [out[name] for name in self.cross_names]
        return sequences, self.backend.to_torch(out["logits"])[:, -1].float()

    def step(self, tokens):
        feeds = {"decoder_input_ids": tokens[:, None], "encoder_attention_mask": self.mask}
        feeds.update(zip(self.past, self.cache))
        feeds.update(zip(self.cross_names, self.cross))
        out = self.backend.run("decoder", feeds)
        self.cache = [out[name] for name in self.present]
        return self.backend.to_torch(out["logits"])[:, -1].float()

    def reorder(self, index):
        # Beams of one prompt share its encoder output, so the cross K/V need no reordering.
        self.cache = [self.backend.select(value, index) for value in self.cache]
