"""Decoding state per kind: the backend's KV-cache buffers and each row's length in them.

Each state carries out `hotrod.generation.state.DecodingState` over the kind's graphs: a decoder-only
model's one graph (`DecoderState`), an encoder-decoder's encoder and decoder graphs (`Seq2SeqState`).
Both keep their self-attention cache in a `SelfCache` (`hotrod.generation.self_cache`), updated in place
by the graph at each row's own length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hotrod.contracts import kv_names
from hotrod.generation.feeds import (
    as_fp32,
    compact_prompts,
    expand_index,
    last_position,
    on_host,
    position_spans,
    prompt_positions,
    token_column,
    zeros_column,
)
from hotrod.generation.self_cache import SelfCache
from hotrod.registry import Dims
from hotrod.runtime.base import Backend, Held


class _OnSelfCache:
    """What both kinds' states do by handing it to their `SelfCache` (`self.kv`)."""

    kv: SelfCache
    token_feed: str  # the decoder graph's input of a step's tokens
    # Prompt widths are rounded up to a multiple of this (a server sets it to its model's invariant rows:
    # a kernel that takes rows in pairs then pairs each token with one of its own row, wherever it lies).
    width_multiple: int = 1
    _logits: tuple[int, dict[str, Any], torch.Tensor] | None = None  # rows, the step's `into`, its [rows, vocab] view
    _passes: tuple[torch.Tensor, dict[int, dict[str, Any]]] | None = None  # one row's pass buffer, `into` by width

    def _step_logits(self, rows: int) -> tuple[dict[str, Any], torch.Tensor] | None:
        """A buffer of the state's own for a step's logits [rows, 1, vocab], as the run's `into`, and its
        [rows, vocab] view, where the backend writes outputs where it is told: no output allocated, handed
        over and let go at every step (on onnxruntime's CPU provider a noticeable part of a step's time
        outside the run). None where it does not, or the graph does not say the vocabulary's size."""
        if self._logits is None or self._logits[0] != rows:
            vocab = self._vocab()
            if vocab is None:
                return None
            buffer = self.backend.empty((rows, 1, vocab))
            self._logits = (rows, {"logits": buffer}, last_position(buffer))
        return self._logits[1], self._logits[2]

    def _pass_logits(self, rows: int, width: int) -> dict[str, Any] | None:
        """The `into` of a verifying pass's logits [1, width, vocab]: the front of one buffer of the state's
        own, as wide as its widest pass, as a step's (`_step_logits`). One row only: a batch's pass holds
        as many vocab-sized rows as it has positions, too many to keep."""
        if rows != 1:
            return None
        if self._passes is None or self._passes[0].shape[1] < width:
            vocab = self._vocab()
            if vocab is None:
                return None
            # Doubled when outgrown: an assistant's drafts widen two tokens at a time, and each new buffer
            # is a zeroed allocation of `width` vocab-sized rows.
            wider = 2 * self._passes[0].shape[1] if self._passes is not None else width
            self._passes = (self.backend.empty((1, max(width, wider), vocab)), {})
        buffer, views = self._passes
        if width not in views:
            views[width] = {"logits": buffer[:, :width]}
        return views[width]

    def _own_logits(self, rows: int, width: int, last: bool) -> tuple[dict[str, Any] | None, torch.Tensor | None]:
        """A run's `into` for its logits and what the state returns of them, where they go into a buffer of
        its own: a step's [rows, vocab] (`last`, one position a row), a one-row pass's [1, width, vocab].
        (None, None) where they do not, and the backend allocates them."""
        if last:
            own = self._step_logits(rows) if width == 1 else None
            return own if own is not None else (None, None)
        into = self._pass_logits(rows, width)
        return (into, into["logits"]) if into is not None else (None, None)

    def _read_logits(self, out: dict[str, Any], own: torch.Tensor | None, last: bool) -> torch.Tensor:
        """The logits a run returns: the state's own (`_own_logits`), else the backend's output as fp32, the
        last position's (`last`) or all."""
        if own is not None:
            return own
        logits = self.backend.to_torch(out["logits"])
        return as_fp32(last_position(logits) if last else logits)

    def _vocab(self) -> int | None:
        """The logits' last axis where the backend writes outputs where it is told and the graph says it."""
        if not self.backend.binds_outputs:
            return None
        vocab = next(t.axes[-1] for t in self.backend.contracts["decoder"].outputs if t.name == "logits")
        return vocab if isinstance(vocab, int) else None

    def chain(self, tokens: torch.Tensor, steps: int, pick: Any) -> torch.Tensor | None:
        """`steps` greedy steps in one call of the backend, each fed the choice (`pick`, see `Backend.chain`)
        of the step before (the first: `tokens` [rows]): every row's `steps` tokens [rows, steps], or None
        where the backend does not chain steps (`Backend.chains_steps`). What each step feeds besides its
        token is known ahead: every row advances by one position a step."""
        if not self.backend.chains_steps:
            return None
        self.kv.reserve(self.kv.length + steps)  # the buffers stay where they are for the whole chain
        plans = []
        for _ in range(steps):
            plans.append(self._plan())
            self.kv.advance()
        return self.backend.chain("decoder", tokens, self.token_feed, plans, self._held(), pick)

    def reorder(self, index: torch.Tensor) -> None:
        self.kv.reorder(index)

    def recycle(self, spare: _OnSelfCache) -> None:
        self.kv.recycle(spare.kv)
        self._logits, self._passes = spare._logits, spare._passes

    def finish(self) -> None:
        self.kv.finish()

    def nbytes(self) -> int:
        if not self.kv.buffers:
            return 0
        logits = [self._logits[2]] if self._logits is not None else []
        logits += [self._passes[0]] if self._passes is not None else []
        return self.kv.nbytes() + sum(self.backend.view(t).nbytes for t in logits)

    @property
    def length(self) -> int:
        return self.kv.length

    def reserve(self, positions: int) -> None:
        self.kv.reserve(positions)

    def release(self, rows: list[int]) -> None:
        self.kv.release(rows)

    def fit(self, positions: int) -> None:
        self.kv.fit(positions)

    @property
    def headroom(self) -> int:
        """Positions the longest row may still take before the buffers must grow (a copy of every row):
        the server verifies drafts only as wide as this, since a pass feeds every row as many tokens."""
        return self.kv.capacity - self.kv.length

    def rewind(self, positions: int | torch.Tensor) -> None:
        """Give back each row's last `positions` cached positions (a count, or one per row): what lies past
        the new lengths is overwritten by later steps, never read."""
        back = positions.numpy() if isinstance(positions, torch.Tensor) else positions
        np.maximum(self.kv.host_lengths - back, 0, out=self.kv.host_lengths)  # in place, as `advance`


class DecoderState(_OnSelfCache):
    """Decoder-only: one graph, prefill then one token per row, over the in-place self cache."""

    sequences_include_prompt = True

    def __init__(self, backend: Backend, dims: Dims, capacity: int):
        self.backend = backend
        self.kv = SelfCache(backend, dims, dims.num_layers, capacity)

    def start(self, input_ids, attention_mask, expand):
        ids, _, lengths = compact_prompts(input_ids, attention_mask, self.width_multiple)
        rows, width = ids.shape
        self.kv.allocate(rows, width)
        # Numpy feeds on the host, as a step's (`hotrod.generation.feeds`): every position's index, each
        # row's last.
        last = lengths.numpy() - 1
        logits = self._run(on_host(ids), prompt_positions(rows, width), self.kv.feeds(last, width), last[:, None])
        self.kv.lengths = lengths
        if expand > 1:
            index = expand_index(rows, expand)
            self.reorder(index)
            input_ids, logits = input_ids[index], logits[index]
        return input_ids, logits

    token_feed = "input_ids"

    def step(self, tokens):
        positions = self.kv.host_lengths[:, None]
        logits = self._run(token_column(tokens), positions, self.kv.step_feeds(), zeros_column(positions.shape[0]))
        self.kv.advance()
        return logits

    def _plan(self) -> dict[str, Any]:
        """A step's feeds but its token, as `step` makes them (copies: the lengths advance in place)."""
        positions = self.kv.host_lengths[:, None].copy()
        return {"position_ids": positions, "logits_positions": zeros_column(positions.shape[0]), **self.kv.step_feeds()}

    def _held(self) -> Held:
        return self.kv.held()

    def verify(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Run `tokens` [rows, k] after each row's cache in one pass: the logits after each of them
        [rows, k, vocab]. The cache holds them all afterwards; `rewind` gives back the rejected ones."""
        rows, k = tokens.shape
        lengths = self.kv.host_lengths
        logits = self._run(tokens, lengths[:, None] + np.arange(k), self.kv.step_feeds(k), position_spans(rows, k),
                           last=False)
        lengths += k  # in place, as `advance`
        return logits

    def _run(self, ids, positions, cache_feeds: dict, logits_positions, last: bool = True) -> torch.Tensor:
        """The logits at `logits_positions`: the last one's [rows, vocab] (`last`), or all [rows, k, vocab]."""
        feeds = {"input_ids": ids, "position_ids": positions, "logits_positions": logits_positions, **cache_feeds}
        into, own = self._own_logits(ids.shape[0], logits_positions.shape[1], last)
        out = self.backend.run("decoder", feeds, into=into, held=self._held())
        return self._read_logits(out, own, last)

    def room_for(self, other: DecoderState) -> bool:
        return bool(self.kv.buffers)  # `place` grows the buffers when a newcomer needs more than they hold

    def place(self, other: DecoderState, pairs: list[tuple[int, int]]) -> None:
        self.kv.place(other.kv, pairs)

    def join(self, others: list[DecoderState], positions: int = 0) -> None:
        self.kv.join([other.kv for other in others], positions)

    def keep(self, index: torch.Tensor) -> None:
        if not len(index):
            self.kv.buffers = []
            return
        self.kv.reorder(index)


class Seq2SeqState(_OnSelfCache):
    """Encoder-decoder: encode once; the first step returns the cross-attention K/V and the start
    token's self K/V (copied into the in-place buffers), then each step writes its own in place.

    Rows' encoder outputs differ in length: cross K/V and encoder masks are right-padded to the
    longest row (the mask hides the padding) and `keep` drops columns no remaining row uses. A source's
    beams (or samples) share its encoder output: where the backend lets them (`shares_sources`), its
    `group` consecutive rows read one copy of its cross K/V and mask, and `reorder`, which moves rows
    within their source, leaves those as they are.
    """

    group: int = 1  # consecutive rows per source that share its cross K/V and encoder mask

    sequences_include_prompt = False

    def __init__(self, backend: Backend, dims: Dims, decoder_start_token_id: int, capacity: int):
        self.backend = backend
        self.start_token = decoder_start_token_id
        layers = dims.num_decoder_layers
        self.kv = SelfCache(backend, dims, layers, capacity)
        self.cross_names = kv_names("cross", layers)
        self.cross: list[Any] = []

    def start(self, input_ids, attention_mask, expand):
        """The encoder and the first decoder step run once a source; its beams (or samples) then copy the
        row's cross K/V, first self K/V and logits, which they share: projecting a 512-token source's
        cross K/V once per beam cost a beam search a tenth of its time."""
        hidden = self.backend.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        hidden = hidden["encoder_hidden_states"]
        mask = attention_mask.contiguous()
        sequences = torch.full((mask.shape[0], 1), self.start_token, dtype=torch.long)
        # Cross K/V land in the backend's device tensors: slots are then filled in place on any device.
        shape = (len(sequences), self.kv.shape[0], mask.shape[1], self.kv.shape[1])
        out = self.backend.run(
            "decoder_init",
            {"decoder_input_ids": sequences, "encoder_attention_mask": mask, "encoder_hidden_states": hidden},
            into={name: self.backend.empty(shape) for name in self.cross_names},
        )
        self.cross = [out[name] for name in self.cross_names]
        present = [self.backend.view(out[name]) for name in self.kv.present]
        logits = as_fp32(last_position(self.backend.to_torch(out["logits"])))
        self.mask, self.group = mask.contiguous(), 1  # the mask is bound by pointer at every step (`_held_feeds`)
        if expand > 1:
            index = expand_index(input_ids.shape[0], expand)
            present = [first[index.to(first.device)] for first in present]
            sequences, logits = sequences[index], logits[index.to(logits.device)]
            self.group = expand
            if not self.backend.shares_sources:
                self._one_per_row()
        self.kv.allocate(len(sequences), 1)
        for buffer, first in zip(self.kv.buffers, present):
            self.backend.view(buffer)[:, :, :1] = first
        self.kv.written = 1
        self.kv.lengths = torch.ones(len(sequences), dtype=torch.long)
        return sequences, logits

    token_feed = "decoder_input_ids"

    def step(self, tokens):
        logits = self._run(token_column(tokens), last=True)
        self.kv.advance()
        return logits

    def _plan(self) -> dict[str, Any]:
        """A step's feeds but its token, as `_run` makes them."""
        return self.kv.step_feeds(1)

    def _held(self) -> Held:
        return self.kv.held(self._held_feeds, (self.cross, self.mask))

    def verify(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Run `tokens` [rows, k] after each row's cache in one pass: the logits after each of them
        [rows, k, vocab]. The cache holds them all afterwards; `rewind` gives back the rejected ones."""
        logits = self._run(tokens, last=False)
        self.kv.host_lengths += tokens.shape[1]  # in place, as `advance`
        return logits

    def _run(self, tokens: Any, last: bool) -> torch.Tensor:
        """The logits after the tokens [rows, k]: the last position's [rows, vocab] (`last`), or all."""
        feeds = {"decoder_input_ids": tokens, **self.kv.step_feeds(tokens.shape[1])}
        into, own = self._own_logits(*tokens.shape, last)
        out = self.backend.run("decoder", feeds, into=into, held=self._held())
        return self._read_logits(out, own, last)

    def finish(self) -> None:
        """The cross K/V and the encoder mask are this generation's alone: neither they nor the `Held` made
        with them stay with the buffers a later state may take."""
        self.kv.finish(held_too=True)
        self.cross, self.mask, self.group = [], None, 1

    def _one_per_row(self) -> None:
        """Each row its own copy of its source's cross K/V and mask, where rows must come and go one by one
        (a server's batch, whose rows are single requests anyway) or the backend shares nothing."""
        if self.group == 1:
            return
        index = expand_index(self.mask.shape[0], self.group)
        self.cross = [self.backend.select(cross, index) for cross in self.cross]
        self.mask, self.group = self.mask[index].contiguous(), 1

    def _held_feeds(self) -> dict[str, Any]:
        """What a step feeds unchanged beside the self cache: the cross K/V and the encoder mask (its rows
        written in place when a request takes a slot, which a buffer bound by pointer sees)."""
        return {**dict(zip(self.cross_names, self.cross)), "encoder_attention_mask": self.mask}

    def room_for(self, other: Seq2SeqState) -> bool:
        return bool(self.kv.buffers) and other.mask.shape[1] <= self.mask.shape[1]

    def place(self, other: Seq2SeqState, pairs: list[tuple[int, int]]) -> None:
        self._one_per_row()
        other._one_per_row()
        self.kv.place(other.kv, pairs)
        width = other.mask.shape[1]
        for a, b in zip(self.cross, other.cross):
            mine, new = self.backend.view(a), self.backend.view(b)
            for slot, row in pairs:
                mine[slot, :, :width] = new[row]
        for slot, row in pairs:
            self.mask[slot] = 0
            self.mask[slot, :width] = other.mask[row]

    def join(self, others: list[Seq2SeqState], positions: int = 0) -> None:
        """Cross K/V and encoder masks pad on the right to the widest."""
        parts = ([self] if self.kv.buffers else []) + list(others)
        for part in parts:
            part._one_per_row()
        self.group = 1
        self.kv.join([other.kv for other in others], positions)
        if len(parts) == 1:
            self.cross, self.mask = parts[0].cross, parts[0].mask
            return
        width = max(part.mask.shape[1] for part in parts)
        total = sum(part.mask.shape[0] for part in parts)
        joined = []
        for layer in range(len(self.cross_names)):
            views = [self.backend.view(part.cross[layer]) for part in parts]
            out = views[0].new_zeros((total, views[0].shape[1], width, views[0].shape[3]))
            start = 0
            for view in views:
                out[start : start + view.shape[0], :, : view.shape[2]] = view
                start += view.shape[0]
            joined.append(out)
        self.cross = joined
        pad = torch.nn.functional.pad
        self.mask = torch.cat([pad(part.mask, (0, width - part.mask.shape[1])) for part in parts])

    def keep(self, index: torch.Tensor) -> None:
        if not len(index):
            self.kv.buffers, self.cross = [], []
            return
        self._one_per_row()
        self.kv.reorder(index)
        self.mask = self.mask[index]
        used = self.mask.bool().any(dim=0)
        width = int(used.nonzero().max()) + 1 if used.any() else self.mask.shape[1]
        self.mask = self.mask[:, :width].contiguous()
        self.cross = [self.backend.view(v)[index.to(self.backend.view(v).device), :, :width].contiguous()
                      for v in self.cross]  # bound by pointer at every step: a copy is made once, here
