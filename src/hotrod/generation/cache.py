"""Decoding state per kind: the attention mask and the backend's KV-cache handles.

A state turns the kind's graph contract into three calls the decoding loop needs: `start` (prefill,
or encode and first decoder step), `step` (one token per row) and `reorder` (beam search). The cache
stays as backend handles throughout; only the last-position logits come back as torch tensors.

For continuous batching, `join` appends the rows of another started state (the cache of rows that began
at different steps is aligned by left padding, which the masks hide) and `keep` lets finished rows leave,
dropping cache columns no remaining row needs. Both copy the cache, once per arrival or departure, never
per step.
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

    def join(self, other: DecodingState) -> None:
        """Append the rows of `other`, a state of the same model that has been started."""

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (the others have finished), trimming padding none of them needs."""

    @property
    def length(self) -> int:
        """Cache positions per row, padding included: what each step reads and copies for every row."""

    def slack(self, rows: torch.Tensor) -> int:
        """Leading cache positions none of `rows` uses: what `keep(rows)` would trim."""

    def room_for(self, other: DecodingState) -> bool:
        """Whether rows of `other` fit in this state's rows without widening it (see `place`)."""

    def place(self, other: DecodingState, pairs: list[tuple[int, int]]) -> None:
        """For each (slot, row): row `row` of `other` overwrites row `slot` of this state, in place.

        The slot's row has left; its cache is overwritten only where the new row has entries, and the
        mask hides the rest. This costs the new row's bytes alone, where `join` copies the whole batch.
        """


def _expand_index(rows: int, expand: int) -> torch.Tensor:
    return torch.arange(rows).repeat_interleave(expand)


def empty_past(dims: Dims, layers: int, batch: int) -> dict[str, torch.Tensor]:
    shape = (batch, dims.num_heads, 0, dims.head_dim)
    return {name: torch.zeros(shape) for name in kv_names("past_key_values", layers)}


def _join(backend: Backend, ours: list[Any], theirs: list[Any], our_len: int, their_len: int,
          left: bool) -> list[torch.Tensor]:
    """Two caches stacked along the batch, the shorter padded with zeros along the sequence axis (2).

    Each part is copied once, straight from the backend's buffers into the joined tensor.
    """
    width = max(our_len, their_len)
    joined = []
    for a, b in zip(ours, theirs):
        a, b = backend.view(a), backend.view(b)
        out = a.new_empty((a.shape[0] + b.shape[0], a.shape[1], width, a.shape[3]))
        for part, rows, length in ((a, slice(0, a.shape[0]), our_len), (b, slice(a.shape[0], None), their_len)):
            span, pad = (slice(width - length, width), slice(0, width - length)) if left else \
                (slice(0, length), slice(length, width))
            out[rows, :, span] = part
            out[rows, :, pad] = 0  # masked, but never left as uninitialised memory
        joined.append(out)
    return joined


def _place_rows(backend: Backend, ours: list[Any], theirs: list[Any], pairs: list[tuple[int, int]],
                start: int) -> None:
    """Write rows of `theirs` into rows of `ours` (in place), from sequence position `start` on."""
    for a, b in zip(ours, theirs):
        mine, new = backend.view(a), backend.view(b)
        for slot, row in pairs:
            mine[slot, :, start : start + new.shape[2]] = new[row]


def _mask_cat(a: torch.Tensor, b: torch.Tensor, left: bool) -> torch.Tensor:
    width = max(a.shape[1], b.shape[1])
    pads = [(width - m.shape[1], 0) if left else (0, width - m.shape[1]) for m in (a, b)]
    return torch.cat([torch.nn.functional.pad(m, p) for m, p in zip((a, b), pads)])


def _unused_columns(mask: torch.Tensor, leading: bool) -> int:
    """How many leading (or trailing) mask columns are zero in every row."""
    used = mask.bool().any(dim=0)
    if leading:
        return int(used.int().argmax()) if used.any() else 0
    return int(used.flip(0).int().argmax()) if used.any() else 0


def _keep_rows(backend: Backend, values: list[Any], index: torch.Tensor, start: int, stop: int) -> list[torch.Tensor]:
    """Rows `index`, sequence positions start:stop, of each cache tensor: one copy each."""
    views = [backend.view(v) for v in values]
    return [t[index.to(t.device), :, start:stop] for t in views]


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

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def slack(self, rows: torch.Tensor) -> int:
        return _unused_columns(self.mask[rows], leading=True)

    def room_for(self, other: DecoderState) -> bool:
        return bool(self.cache) and other.length <= self.length

    def place(self, other: DecoderState, pairs: list[tuple[int, int]]) -> None:
        start = self.length - other.length
        _place_rows(self.backend, self.cache, other.cache, pairs, start)
        for slot, row in pairs:
            self.mask[slot] = 0
            self.mask[slot, start:] = other.mask[row]
            self.next_position[slot] = other.next_position[row]

    def join(self, other: DecoderState) -> None:
        if not self.cache:
            self.cache, self.mask, self.next_position = other.cache, other.mask, other.next_position
            return
        self.cache = _join(self.backend, self.cache, other.cache, self.length, other.length, left=True)
        self.mask = _mask_cat(self.mask, other.mask, left=True)
        self.next_position = torch.cat([self.next_position, other.next_position])

    def keep(self, index: torch.Tensor) -> None:
        if not len(index):
            self.cache = []
            return
        self.mask, self.next_position = self.mask[index], self.next_position[index]
        drop = _unused_columns(self.mask, leading=True)
        self.cache = _keep_rows(self.backend, self.cache, index, drop, self.mask.shape[1])
        self.mask = self.mask[:, drop:]


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
        self.self_mask = torch.ones_like(sequences)
        return sequences, self.backend.to_torch(out["logits"])[:, -1].float()

    def step(self, tokens):
        self.self_mask = torch.cat([self.self_mask, self.self_mask.new_ones(self.self_mask.shape[0], 1)], dim=1)
        feeds = {"decoder_input_ids": tokens[:, None], "decoder_attention_mask": self.self_mask,
                 "encoder_attention_mask": self.mask}
        feeds.update(zip(self.past, self.cache))
        feeds.update(zip(self.cross_names, self.cross))
        out = self.backend.run("decoder", feeds)
        self.cache = [out[name] for name in self.present]
        return self.backend.to_torch(out["logits"])[:, -1].float()

    def reorder(self, index):
        # Beams of one prompt share its encoder output, so the cross K/V need no reordering.
        self.cache = [self.backend.select(value, index) for value in self.cache]
        self.self_mask = self.self_mask[index]

    @property
    def length(self) -> int:
        return self.self_mask.shape[1]

    def slack(self, rows: torch.Tensor) -> int:
        return _unused_columns(self.self_mask[rows], leading=True)

    def room_for(self, other: Seq2SeqState) -> bool:
        return bool(self.cache) and other.length <= self.length and other.mask.shape[1] <= self.mask.shape[1]

    def place(self, other: Seq2SeqState, pairs: list[tuple[int, int]]) -> None:
        start = self.length - other.length
        _place_rows(self.backend, self.cache, other.cache, pairs, start)
        _place_rows(self.backend, self.cross, other.cross, pairs, 0)
        width = other.mask.shape[1]
        for slot, row in pairs:
            self.self_mask[slot] = 0
            self.self_mask[slot, start:] = other.self_mask[row]
            self.mask[slot] = 0
            self.mask[slot, :width] = other.mask[row]

    def join(self, other: Seq2SeqState) -> None:
        """Self-attention caches align on the left (masked); cross K/V and encoder masks pad on the right."""
        if not self.cache:
            self.cache, self.cross, self.mask, self.self_mask = other.cache, other.cross, other.mask, other.self_mask
            return
        b = self.backend
        self.cache = _join(b, self.cache, other.cache, self.length, other.length, left=True)
        self.cross = _join(b, self.cross, other.cross, self.mask.shape[1], other.mask.shape[1], left=False)
        self.self_mask = _mask_cat(self.self_mask, other.self_mask, left=True)
        self.mask = _mask_cat(self.mask, other.mask, left=False)

    def keep(self, index: torch.Tensor) -> None:
        if not len(index):
            self.cache = self.cross = []
            return
        self.self_mask, self.mask = self.self_mask[index], self.mask[index]
        drop = _unused_columns(self.self_mask, leading=True)
        self.cache = _keep_rows(self.backend, self.cache, index, drop, self.self_mask.shape[1])
        self.self_mask = self.self_mask[:, drop:]
        width = self.mask.shape[1] - _unused_columns(self.mask, leading=False)
        self.cross = _keep_rows(self.backend, self.cross, index, 0, width)
        self.mask = self.mask[:, :width]
