"""Decoding state per kind: the attention mask and the backend's KV-cache handles.

A state turns the kind's graph contract into three calls the decoding loop needs: `start` (prefill,
or encode and first decoder step), `step` (one token per row) and `reorder` (beam search). The cache
stays as backend handles throughout; only the last-position logits come back as torch tensors.

For continuous batching, `join` appends the rows of another started state, `place` writes new rows
into free slots, and `keep` lets finished rows leave. The decoder-only cache is ragged (each row its own
length, in buffers updated in place), so rows that began at different steps need no alignment. The
seq2seq self-attention cache is aligned by left padding, which the masks hide, and `keep` drops columns
no remaining row needs. All of these copy cache rows once per arrival or departure, never per step.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hotrod.errors import HotrodError
from hotrod.export.io import kv_names
from hotrod.registry import Dims
from hotrod.runtime.base import Backend


class DecodingState(Protocol):
    sequences_include_prompt: bool  # rows start with the prompt (decoder-only) or a start token (seq2seq)
    ragged: bool  # rows keep their own cache lengths: batching rows of different lengths pads nothing

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
        mask (or the row's length) hides the rest. This costs the new row's bytes alone, where `join`
        copies the whole batch.
        """

    def reserve(self, positions: int) -> None:
        """Make room for rows of `positions` cache positions (before `start`, or before `place`)."""

    def release(self, rows: list[int]) -> None:
        """Rows `rows` have left: keep them as cheap free slots until `place` reuses them."""

    def fit(self, positions: int) -> None:
        """The rows left need at most `positions` each: give back memory held for rows that have gone."""


def _expand_index(rows: int, expand: int) -> torch.Tensor:
    return torch.arange(rows).repeat_interleave(expand)


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


def compact_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's real tokens moved to the front, in order: (ids, their original columns, lengths).

    The result is right-padded to the longest row. Dropping the masked tokens computes exactly what
    masking them does; a row's generation positions count its real tokens (as transformers' do).
    """
    lengths = attention_mask.ne(0).sum(dim=1)
    if not bool((lengths > 0).all()):
        raise HotrodError("a prompt row has no tokens (its attention_mask is all zeros)")
    order = torch.sort(attention_mask.eq(0).int(), dim=1, stable=True).indices[:, : int(lengths.max())]
    return input_ids.gather(1, order), order, lengths


class DecoderState:
    """Decoder-only: one graph, prefill then one token per row, over cache buffers updated in place.

    Each row has its own length: its cache holds exactly its tokens, from position 0, so rows that began
    at different steps share a batch with no padding and no mask. The buffers hold `capacity` positions
    per row and grow (one copy) only when a row would pass that.
    """

    sequences_include_prompt = True
    ragged = True

    def __init__(self, backend: Backend, dims: Dims, capacity: int):
        self.backend = backend
        self.dims = dims
        self.present = kv_names("present", dims.num_layers)
        self.past = kv_names("past_key_values", dims.num_layers)
        self.capacity = capacity
        self.cache: list[Any] = []
        self.lengths = torch.zeros(0, dtype=torch.long)  # cached positions per row
        self.idle = torch.zeros(0, dtype=torch.bool)  # released rows: fed a dummy token, kept at length 0

    def start(self, input_ids, attention_mask, expand):
        ids, _, lengths = compact_prompts(input_ids, attention_mask)
        rows, width = ids.shape
        self.capacity = max(self.capacity, width)
        self.cache = [self.backend.empty((rows, self.dims.num_heads, self.capacity, self.dims.head_dim))
                      for _ in self.past]
        positions = torch.arange(width).expand(rows, width)
        logits = self._run(ids, positions, lengths - 1, width, (lengths - 1)[:, None])
        self.lengths, self.idle = lengths, torch.zeros(rows, dtype=torch.bool)
        if expand > 1:
            index = _expand_index(rows, expand)
            self.reorder(index)
            input_ids, logits = input_ids[index], logits[index]
        return input_ids, logits

    def step(self, tokens):
        total = int(self.lengths.max()) + 1
        self.reserve(total)
        logits = self._run(tokens[:, None], self.lengths[:, None], self.lengths, total,
                           torch.zeros(len(self.lengths), 1, dtype=torch.long))
        self.lengths = torch.where(self.idle, 0, self.lengths + 1)
        return logits

    def _run(self, ids, positions, seqlens_k, total: int, logits_positions) -> torch.Tensor:
        feeds = {"input_ids": ids, "position_ids": positions, "seqlens_k": seqlens_k.int(),
                 "total_sequence_length": torch.tensor(total, dtype=torch.int32), "logits_positions": logits_positions}
        feeds.update(zip(self.past, self.cache))
        out = self.backend.run("decoder", feeds, into=dict(zip(self.present, self.cache)))
        return self.backend.to_torch(out["logits"])[:, -1].float()

    def reorder(self, index):
        self.cache = [self.backend.select(value, index) for value in self.cache]
        self.lengths, self.idle = self.lengths[index], self.idle[index]

    def reserve(self, positions: int) -> None:
        """Room for `positions` per row: a larger buffer (one copy of the used part) when needed."""
        if positions <= self.capacity:
            return
        grown = max(positions, self.capacity + self.capacity // 2)
        if self.dims.max_positions:
            grown = max(positions, min(grown, self.dims.max_positions))
        if self.cache:
            used = int(self.lengths.max())
            self.cache = [self._copy_into(self._new(len(self.lengths), grown), value, used) for value in self.cache]
        self.capacity = grown

    def fit(self, positions: int) -> None:
        """Shrink the buffers to `positions` per row (one copy) once they hold twice that: a long request
        that has left would otherwise keep every row's buffer long, beyond the server's cache budget."""
        positions = max(positions, self.length)
        if not self.cache or self.capacity < 2 * positions:
            return
        used = self.length
        self.cache = [self._copy_into(self._new(len(self.lengths), positions), value, used) for value in self.cache]
        self.capacity = positions

    def _new(self, rows: int, capacity: int) -> Any:
        return self.backend.empty((rows, self.dims.num_heads, capacity, self.dims.head_dim))

    def _copy_into(self, target: Any, source: Any, used: int, rows: slice = slice(None)) -> Any:
        self.backend.view(target)[rows, :, :used] = self.backend.view(source)[:, :, :used]
        return target

    @property
    def length(self) -> int:
        return int(self.lengths.max()) if len(self.lengths) else 0

    def slack(self, rows: torch.Tensor) -> int:
        return 0  # rows start at position 0: nothing to trim

    def room_for(self, other: DecoderState) -> bool:
        return bool(self.cache)  # `place` grows the buffers when a newcomer is longer than they hold

    def place(self, other: DecoderState, pairs: list[tuple[int, int]]) -> None:
        self.reserve(other.capacity)  # what the newcomers will need, not only what they hold now
        for a, b in zip(self.cache, other.cache):
            mine, new = self.backend.view(a), self.backend.view(b)
            for slot, row in pairs:
                used = int(other.lengths[row])
                mine[slot, :, :used] = new[row, :, :used]
        for slot, row in pairs:
            self.lengths[slot], self.idle[slot] = other.lengths[row], False

    def release(self, rows: list[int]) -> None:
        """Rows whose requests left: they cost one position each per step until `place` reuses them."""
        self.lengths[rows], self.idle[rows] = 0, True

    def join(self, other: DecoderState) -> None:
        if not self.cache:
            self.cache, self.lengths, self.idle, self.capacity = other.cache, other.lengths, other.idle, other.capacity
            return
        rows, capacity = len(self.lengths), max(self.capacity, other.capacity)
        total = rows + len(other.lengths)
        joined = []
        for a, b in zip(self.cache, other.cache):
            out = self._new(total, capacity)
            self._copy_into(out, a, self.length, slice(0, rows))
            joined.append(self._copy_into(out, b, other.length, slice(rows, total)))
        self.cache, self.capacity = joined, capacity
        self.lengths, self.idle = torch.cat([self.lengths, other.lengths]), torch.cat([self.idle, other.idle])

    def keep(self, index: torch.Tensor) -> None:
        if not len(index):
            self.cache = []
            return
        self.reorder(index)


class Seq2SeqState:
    """Encoder-decoder: encode once, first step returns the cross-attention K/V, then step with past.

    Its self-attention cache is appended by the kernel (`MultiHeadAttention`), so rows are aligned by left
    padding and masked; `ragged` is False.
    """

    sequences_include_prompt = False
    ragged = False

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

    def reserve(self, positions: int) -> None:
        """Nothing to do: each step's cache is a new tensor one position longer."""

    def release(self, rows: list[int]) -> None:
        """Nothing to do: a released row runs on, masked and unread, until reused."""

    def fit(self, positions: int) -> None:
        """Nothing to do: the cache holds the positions used so far, and `keep` trims what none use."""

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
