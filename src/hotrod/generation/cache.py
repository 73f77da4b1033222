"""Decoding state per kind: the backend's KV-cache buffers and each row's length in them.

A state turns the kind's graph contract into three calls the decoding loop needs: `start` (prefill,
or encode and first decoder step), `step` (one token per row) and `reorder` (beam search). The cache
stays with the backend throughout; only the last-position logits come back as torch tensors.

The self-attention cache is a buffer per layer that the graph updates in place (`SelfCache`): each row
has its own length, so a step reads each row's cache once and copies nothing, and rows that began at
different steps share a batch with no padding. For continuous batching, `join` appends the rows of
another started state, `place` writes new rows into free slots, `release` turns finished rows into free
slots and `keep` drops rows. Each copies cache rows once per arrival or departure, never per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from hotrod.contracts import kv_names
from hotrod.errors import HotrodError
from hotrod.registry import Dims
from hotrod.runtime.base import Backend, Held


class DecodingState(Protocol):
    sequences_include_prompt: bool  # rows start with the prompt (decoder-only) or a start token (seq2seq)

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, expand: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (initial sequences, next-token logits), each row repeated `expand` times."""

    def step(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Feed one token per row (a tensor, or numpy ids on the host); returns next-token logits [rows,
        vocab], which the next call to the state may overwrite (a backend that writes outputs where it is
        told writes them into a buffer of the state's own)."""

    def reorder(self, index: torch.Tensor) -> None:
        """Keep cache rows `index` (beam search)."""

    def join(self, others: list[DecodingState], positions: int = 0) -> None:
        """Append the rows of `others`, in order: started states of the same model. The joined buffers
        hold at least `positions` per row (what the rows will need, when the parts hold less); joining
        no others only sizes the state's own buffers so."""

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (the others have finished)."""

    def room_for(self, other: DecodingState) -> bool:
        """Whether rows of `other` can take free slots of this state (see `place`)."""

    def place(self, other: DecodingState, pairs: list[tuple[int, int]]) -> None:
        """For each (slot, row): row `row` of `other` overwrites row `slot` of this state, in place.

        The slot's row has left; the new row's cache is copied at its own length. This costs the new
        row's bytes alone, where `join` copies the whole batch.
        """

    def reserve(self, positions: int) -> None:
        """Make room for rows of `positions` cache positions (before `start`, or before `place`)."""

    def release(self, rows: list[int]) -> None:
        """Rows `rows` have left: keep them as cheap free slots until `place` reuses them."""

    def fit(self, positions: int) -> None:
        """The rows left need at most `positions` each: give back memory held for rows that have gone."""

    def verify(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Run `tokens` [rows, k] (a tensor, or numpy ids on the host) after each row's cache in one pass: the
        logits after each [rows, k, vocab], which the next pass may overwrite (as a step's)."""

    def rewind(self, positions: int | torch.Tensor) -> None:
        """Give back each row's last `positions` cached positions (a count, or one per row)."""

    def recycle(self, spare: DecodingState) -> None:
        """Start (`start`) in the buffers of `spare`, a finished generation's state of the same model, where
        they fit: zeroed, as new ones, without their making and binding."""

    def finish(self) -> None:
        """The generation is over: let go of what only it used (an encoder-decoder's cross K/V), keeping the
        buffers a later state may `recycle`."""

    def nbytes(self) -> int:
        """The bytes of the buffers the state holds for its generation (0 before `start`)."""

    @property
    def headroom(self) -> int:
        """Positions the longest row may still take before the buffers must grow."""


ROUND_POSITIONS = 64  # a grown cache's positions per row are a multiple of this (see `SelfCache._rounded`)


def rounded_positions(positions: int) -> int:
    """`positions` up to a multiple of ROUND_POSITIONS: what a grown cache holds per row for them."""
    return -(-positions // ROUND_POSITIONS) * ROUND_POSITIONS


class SelfCache:
    """Self-attention K/V buffers [rows, heads, capacity, head_dim], updated in place by the graph.

    Row r holds `lengths[r]` positions, from position 0. The buffers grow (one copy) only when a row
    would pass `capacity`. A released row is idle: it is fed a dummy token at position 0 and never read.
    """

    def __init__(self, backend: Backend, dims: Dims, layers: int, capacity: int):
        self.backend = backend
        self.shape = (dims.num_heads, dims.head_dim)
        self.max_positions = dims.max_positions
        self.past = kv_names("past_key_values", layers)
        self.present = kv_names("present", layers)
        self.capacity = capacity
        self.buffers: list[Any] = []  # replaced whenever a buffer is, never changed in place (`held`)
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.idle = torch.zeros(0, dtype=torch.bool)
        self._held: tuple[tuple, Held] | None = None  # what `held` made last, and from what
        self._spare: SelfCache | None = None  # a finished generation's cache, whose buffers `allocate` may take

    @property
    def buffers(self) -> list[Any]:
        return self._buffers

    @buffers.setter
    def buffers(self, value: list[Any]) -> None:
        """Replaced buffers: the `Held` made of the old ones goes with them (it would keep them alive), and
        how many positions a row they have been written is not known (`written`: None)."""
        self._buffers, self._held, self.written, self._slab = value, None, None, None

    @property
    def lengths(self) -> torch.Tensor:
        """Each row's cached positions (on the host). `host_lengths` is the same memory as numpy: a step reads
        and advances it there, without a torch call (see `_host`)."""
        return self._lengths

    @lengths.setter
    def lengths(self, value: torch.Tensor) -> None:
        self._lengths, self.host_lengths = value, value.numpy()

    @property
    def idle(self) -> torch.Tensor:
        return self._idle

    @idle.setter
    def idle(self, value: torch.Tensor) -> None:
        """Rows that hold no request; whether there are any is kept as a Python bool, since a decoding step
        asks it and a tensor's answer costs several microseconds of a step budget of 200."""
        self._idle = value
        self.some_idle = bool(value.any())

    def allocate(self, rows: int, capacity: int) -> None:
        """Zeroed buffers for `rows` rows of at least `capacity` positions (and the capacity asked at
        construction): a spare's (`recycle`) where they are as many rows and hold as many positions."""
        self.capacity = max(self.capacity, capacity)
        spare, self._spare = self._spare, None
        if spare is not None and spare.fits(rows, self.capacity):
            self._take(spare)
        elif self.backend.pools_cache:  # each buffer lent by the backend's pool, by rows
            self.buffers = [self._new(rows, self.capacity) for _ in self.past]
            self.written = 0
        else:  # every layer's in one allocation, which a recycling state zeroes in one call (`_take`)
            slab = self.backend.view(self.backend.empty((len(self.past), rows, self.shape[0], self.capacity,
                                                         self.shape[1])))
            self.buffers = list(slab.unbind(0))
            self.written, self._slab = 0, slab
        self.lengths, self.idle = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.bool)

    def recycle(self, spare: SelfCache) -> None:
        """Let `allocate` take the buffers of `spare`, the cache of a finished generation of the same model.

        A generation's buffers, their `Held` and the binding that holds it then serve the next one: making
        and binding them afresh cost about 0.2 ms a call (the demo GPT-2, 4 layers: a fifth of a short
        generation's time outside its graph runs). What the last generation wrote is zeroed: the state
        is as a new one's, whatever the last one left.
        """
        self._spare = spare

    def finish(self, held_too: bool = False) -> None:
        """The generation is over: a spare it never took is let go, and (`held_too`) the `Held` made of the
        buffers, where it holds more than them (an encoder-decoder's cross K/V)."""
        self._spare = None
        if held_too:
            self._held = None

    def fits(self, rows: int, capacity: int) -> bool:
        """Whether the buffers are `rows` rows of at least `capacity` positions."""
        if not self.buffers:
            return False
        shape = self.backend.view(self.buffers[0]).shape
        return shape[0] == rows and shape[2] >= capacity

    def nbytes(self) -> int:
        """The buffers' size in bytes (each layer's key and value buffers are the same size)."""
        return self.backend.view(self.buffers[0]).nbytes * len(self.buffers) if self.buffers else 0

    def _take(self, spare: SelfCache) -> None:
        """`spare`'s buffers (and the `Held` made of them), the positions it wrote zeroed."""
        written = spare.written
        self._buffers, self._held, self._slab = spare.buffers, spare._held, spare._slab
        first = self.backend.view(self.buffers[0])
        self.capacity = first.shape[2]
        if self._slab is not None:
            self._slab[:, :, :, :written].zero_()
        else:
            for buffer in self.buffers:
                self.backend.view(buffer)[:, :, :written].zero_()
        if first.is_cuda:  # zeroed on torch's stream: done before a graph on a stream of its own reads them
            torch.cuda.current_stream(first.device).synchronize()
        self.written = 0

    def feeds(self, seqlens_k: np.ndarray | torch.Tensor, total: int) -> dict[str, Any]:
        """The graph's cache lengths (its buffers are `held`): `seqlens_k` is each row's length after this
        call, minus one."""
        seqlens = seqlens_k.numpy() if isinstance(seqlens_k, torch.Tensor) else seqlens_k
        if self.written is not None and total > self.written:
            self.written = total  # the run writes up to here
        return {"seqlens_k": seqlens.astype(np.int32), "total_sequence_length": _int32(total)}

    def held(self, others: Callable[[], dict[str, Any]] | None = None, of: tuple = ()) -> Held:
        """The buffers as the graph's cache inputs and, the same memory, its outputs (updated in place), with
        the feeds `others` makes beside them: one `Held`, made again only when the buffers or one of the
        objects `others` makes them from (`of`) is replaced, so that a backend keeps them bound from step
        to step."""
        source = (self.buffers, *of)
        if self._held is None or any(a is not b for a, b in zip(self._held[0], source)):
            feeds = dict(zip(self.past, self.buffers))
            feeds.update(others() if others is not None else {})
            self._held = (source, Held(feeds, dict(zip(self.present, self.buffers))))
        return self._held[1]

    def step_feeds(self, tokens: int = 1) -> dict[str, Any]:
        """Cache lengths for `tokens` new tokens per row (growing the buffers first if a row needs it)."""
        lengths = self.host_lengths
        total = max(lengths.tolist()) + tokens
        self.reserve(total)
        return self.feeds(lengths if tokens == 1 else lengths + (tokens - 1), total)

    def advance(self) -> None:
        if self.some_idle:
            self.lengths = torch.where(self.idle, 0, self.lengths + 1)
        else:  # in place: a new tensor a step cost a torch call, cold again after every run
            self.host_lengths += 1

    @property
    def length(self) -> int:
        return int(self.lengths.max()) if len(self.lengths) else 0

    def reserve(self, positions: int) -> None:
        if positions <= self.capacity:
            return
        self._resize(self._rounded(max(positions, self.capacity + self.capacity // 2), positions))

    def _rounded(self, capacity: int, needed: int) -> int:
        """`capacity` up to a multiple of ROUND_POSITIONS, within the model's positions (never under
        `needed`): a server batch sized for its rows' needs then seldom grows for one newcomer's few more
        positions, each growth being a copy of every row into fresh memory."""
        capacity = rounded_positions(capacity)
        if self.max_positions:
            capacity = min(capacity, self.max_positions)
        return max(capacity, needed)

    def fit(self, positions: int) -> None:
        """Shrink to `positions` per row (one copy) once the buffers hold twice that: a long request that
        has left would otherwise keep every row's buffer long, beyond the server's cache budget."""
        positions = max(positions, self.length)
        if self.buffers and self.capacity >= 2 * positions:
            self._resize(positions)

    def _resize(self, capacity: int) -> None:
        if self.buffers:
            used = self.length
            self.buffers = [self._copy(self._new(len(self.lengths), capacity), value, used) for value in self.buffers]
        self.capacity = capacity

    def reorder(self, index: torch.Tensor) -> None:
        self.buffers = [self.backend.select(value, index) for value in self.buffers]
        self.lengths, self.idle = self.lengths[index], self.idle[index]

    def place(self, other: SelfCache, pairs: list[tuple[int, int]]) -> None:
        self.reserve(other.capacity)  # what the newcomers will need, not only what they hold now
        for a, b in zip(self.buffers, other.buffers):
            mine, new = self.backend.view(a), self.backend.view(b)
            for slot, row in pairs:
                used = int(other.lengths[row])
                mine[slot, :, :used] = new[row, :, :used]
        for slot, row in pairs:
            self.lengths[slot], self.idle[slot] = other.lengths[row], False
        self.idle = self.idle
        self.written = None  # the newcomers' rows, up to their own lengths

    def release(self, rows: list[int]) -> None:
        self.lengths[rows], self.idle[rows] = 0, True
        self.idle = self.idle

    def join(self, others: list[SelfCache], positions: int = 0) -> None:
        """Append the rows of `others`, in order, in one new buffer per layer: joining several states at
        once copies each row once, where joining them one by one recopies the rows joined before."""
        parts = ([self] if self.buffers else []) + list(others)
        capacity = max(part.capacity for part in parts)
        if positions > capacity:
            capacity = self._rounded(positions, positions)
        if len(parts) == 1:
            part = parts[0]
            self.buffers, self.lengths, self.idle, self.capacity = part.buffers, part.lengths, part.idle, part.capacity
            if capacity > self.capacity:
                self._resize(capacity)
            return
        total = sum(len(part.lengths) for part in parts)
        joined = []
        for layer in range(len(self.past)):
            out, start = self._new(total, capacity), 0
            for part in parts:
                rows = len(part.lengths)
                self._copy(out, part.buffers[layer], part.length, slice(start, start + rows))
                start += rows
            joined.append(out)
        self.buffers, self.capacity = joined, capacity
        self.lengths = torch.cat([part.lengths for part in parts])
        self.idle = torch.cat([part.idle for part in parts])

    def _new(self, rows: int, capacity: int) -> Any:
        return self.backend.empty((rows, self.shape[0], capacity, self.shape[1]))

    def _copy(self, target: Any, source: Any, used: int, rows: slice = slice(None)) -> Any:
        self.backend.view(target)[rows, :, :used] = self.backend.view(source)[:, :, :used]
        return target


@functools.lru_cache(maxsize=4096)
def _int32(value: int) -> np.ndarray:
    """A 0-d int32 array of `value`, made once: a decoding step feeds its length as one. Never written to
    (backends copy or read feeds)."""
    return np.array(value, dtype=np.int32)


@functools.lru_cache(maxsize=256)
def _zeros(rows: int) -> np.ndarray:
    """[rows, 1] int64 zeros, made once per row count (as `_int32`): each row's logits position in a step."""
    return np.zeros((rows, 1), dtype=np.int64)


def _host(array: np.ndarray) -> torch.Tensor:
    """A torch tensor on a numpy result. A decoding step's few small host values (each row's length and
    position) are computed in numpy, and fed as numpy arrays: a torch call's code is cold again after every
    graph run has streamed the weights through the caches (a small add takes 3.7 us warm, 15-26 after such
    a sweep; asking a tensor its shape, type and device to copy it into a bound buffer, about 15 us a
    feed), numpy's far less so."""
    return torch.from_numpy(array)


def on_host(values: torch.Tensor | np.ndarray) -> np.ndarray | torch.Tensor:
    """Token ids as a numpy array where they are on the CPU (see `_host`: numpy's calls, its tolist among
    them, cost several times less than torch's), else the tensor itself."""
    if isinstance(values, np.ndarray) or values.device.type != "cpu":
        return values
    return values.numpy()


def _column(values: torch.Tensor | np.ndarray) -> np.ndarray | torch.Tensor:
    """[rows] -> [rows, 1] (a step's one token a row), a numpy array on the CPU (see `_host`)."""
    return on_host(values)[:, None]


def _last(logits: torch.Tensor) -> torch.Tensor:
    """[rows, width, vocab] -> the last position's [rows, vocab], through numpy where it can (see `_host`)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        return _host(logits.numpy()[:, -1])
    return logits[:, -1]


def _float(logits: torch.Tensor) -> torch.Tensor:
    """Logits as float32; fp32 logits as they are, without a call into torch (each costs microseconds of a
    step, its code cold again after every graph run has streamed the weights through the caches)."""
    return logits if logits.dtype == torch.float32 else logits.float()


@functools.lru_cache(maxsize=256)
def _spans(rows: int, width: int) -> np.ndarray:
    """[rows, width] of 0 .. width-1, made once per shape (as `_zeros`): every position's logits in a pass
    that verifies a draft."""
    return np.tile(np.arange(width), (rows, 1))  # its own memory, writable (a broadcast view is neither)


CACHED_SPAN_ELEMENTS = 4096  # prompts' positions up to this many are `_spans`' cached arrays


def _positions(rows: int, width: int) -> np.ndarray:
    """Every position's index in a prompt of `rows` x `width`: `_spans`' array, made once, where it is small;
    a long prompt's of its own (256 cached arrays of long prompts would hold hundreds of megabytes)."""
    return _spans(rows, width) if rows * width <= CACHED_SPAN_ELEMENTS else np.tile(np.arange(width), (rows, 1))


def _expand_index(rows: int, expand: int) -> torch.Tensor:
    return torch.arange(rows).repeat_interleave(expand)


def compact_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's real tokens moved to the front, in order: (ids, their original columns, lengths).

    The result is right-padded to the longest row, rounded up to a `multiple` of columns (see
    `SelfCache.width_multiple`). Dropping the masked tokens computes exactly what masking them does; a
    row's generation positions count its real tokens (as transformers' do).
    """
    rows, width = input_ids.shape
    if width and bool(attention_mask.all()):  # no padding (a lone prompt, most often): nothing moves
        ids, order = input_ids, torch.arange(width).expand(rows, width)
        lengths = torch.full((rows,), width, dtype=torch.long)
    else:
        lengths = attention_mask.ne(0).sum(dim=1)
        if not bool((lengths > 0).all()):
            raise HotrodError("a prompt row has no tokens (its attention_mask is all zeros)")
        order = torch.sort(attention_mask.eq(0).int(), dim=1, stable=True).indices[:, : int(lengths.max())]
        ids = input_ids.gather(1, order)
    extra = -ids.shape[1] % multiple
    if extra:  # columns past every row's length: written to the cache past its length, never read
        ids = torch.nn.functional.pad(ids, (0, extra))
        order = torch.nn.functional.pad(order, (0, extra), value=input_ids.shape[1] - 1)
    return ids, order, lengths


class _OnSelfCache:
    """What both kinds' states do by handing it to their `SelfCache` (`self.kv`)."""

    kv: SelfCache
    # Prompt widths are rounded up to a multiple of this (a server sets it to its model's invariant rows:
    # a kernel that takes rows in pairs then pairs each token with one of its own row, wherever it lies).
    width_multiple: int = 1
    _logits: tuple[int, dict[str, Any], torch.Tensor] | None = None  # rows, the step's `into`, its [rows, vocab] view
    _passes: tuple[torch.Tensor, dict[int, dict[str, Any]]] | None = None  # one row's pass buffer, `into` by width

    def _step_logits(self, rows: int) -> tuple[dict[str, Any], torch.Tensor] | None:
        """A buffer of the state's own for a step's logits [rows, 1, vocab], as the run's `into`, and its
        [rows, vocab] view, where the backend writes outputs where it is told: no output allocated, handed
        over and let go at every step (on onnxruntime's CPU provider about 30 us of a step's time outside
        the run). None where it does not, or the graph does not say the vocabulary's size."""
        if self._logits is None or self._logits[0] != rows:
            vocab = self._vocab()
            if vocab is None:
                return None
            buffer = self.backend.empty((rows, 1, vocab))
            self._logits = (rows, {"logits": buffer}, _last(buffer))
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
        return _float(_last(logits) if last else logits)

    def _vocab(self) -> int | None:
        """The logits' last axis where the backend writes outputs where it is told and the graph says it."""
        if not self.backend.binds_outputs:
            return None
        vocab = next(t.axes[-1] for t in self.backend.contracts["decoder"].outputs if t.name == "logits")
        return vocab if isinstance(vocab, int) else None

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
        # Numpy feeds on the host, as a step's (see `_host`): every position's index, each row's last.
        last = lengths.numpy() - 1
        logits = self._run(on_host(ids), _positions(rows, width), self.kv.feeds(last, width), last[:, None])
        self.kv.lengths = lengths
        if expand > 1:
            index = _expand_index(rows, expand)
            self.reorder(index)
            input_ids, logits = input_ids[index], logits[index]
        return input_ids, logits

    def step(self, tokens):
        positions = self.kv.host_lengths[:, None]
        logits = self._run(_column(tokens), positions, self.kv.step_feeds(), _zeros(positions.shape[0]))
        self.kv.advance()
        return logits

    def verify(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Run `tokens` [rows, k] after each row's cache in one pass: the logits after each of them
        [rows, k, vocab]. The cache holds them all afterwards; `rewind` gives back the rejected ones."""
        rows, k = tokens.shape
        lengths = self.kv.host_lengths
        logits = self._run(tokens, lengths[:, None] + np.arange(k), self.kv.step_feeds(k), _spans(rows, k),
                           last=False)
        lengths += k  # in place, as `advance`
        return logits

    def _run(self, ids, positions, cache_feeds: dict, logits_positions, last: bool = True) -> torch.Tensor:
        """The logits at `logits_positions`: the last one's [rows, vocab] (`last`), or all [rows, k, vocab]."""
        feeds = {"input_ids": ids, "position_ids": positions, "logits_positions": logits_positions, **cache_feeds}
        into, own = self._own_logits(ids.shape[0], logits_positions.shape[1], last)
        out = self.backend.run("decoder", feeds, into=into, held=self.kv.held())
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
    longest row (the mask hides the padding) and `keep` drops columns no remaining row uses. Beams of
    one prompt share its encoder output, so `reorder` leaves the cross K/V as they are.
    """

    sequences_include_prompt = False

    def __init__(self, backend: Backend, dims: Dims, decoder_start_token_id: int, capacity: int):
        self.backend = backend
        self.start_token = decoder_start_token_id
        layers = dims.num_decoder_layers
        self.kv = SelfCache(backend, dims, layers, capacity)
        self.cross_names = kv_names("cross", layers)
        self.cross: list[Any] = []

    def start(self, input_ids, attention_mask, expand):
        hidden = self.backend.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        hidden = hidden["encoder_hidden_states"]
        if expand > 1:
            index = _expand_index(input_ids.shape[0], expand)
            hidden, attention_mask = self.backend.select(hidden, index), attention_mask[index]
        self.mask = attention_mask.contiguous()  # bound by pointer at every step (`_held_feeds`)
        sequences = torch.full((attention_mask.shape[0], 1), self.start_token, dtype=torch.long)
        # Cross K/V land in the backend's device tensors: slots are then filled in place on any device.
        shape = (len(sequences), self.kv.shape[0], attention_mask.shape[1], self.kv.shape[1])
        out = self.backend.run(
            "decoder_init",
            {"decoder_input_ids": sequences, "encoder_attention_mask": self.mask, "encoder_hidden_states": hidden},
            into={name: self.backend.empty(shape) for name in self.cross_names},
        )
        self.kv.allocate(len(sequences), 1)
        for buffer, name in zip(self.kv.buffers, self.kv.present):
            self.backend.view(buffer)[:, :, :1] = self.backend.view(out[name])
        self.kv.written = 1
        self.kv.lengths = torch.ones(len(sequences), dtype=torch.long)
        self.cross = [out[name] for name in self.cross_names]
        return sequences, _float(_last(self.backend.to_torch(out["logits"])))

    def step(self, tokens):
        logits = self._run(_column(tokens), last=True)
        self.kv.advance()
        return logits

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
        out = self.backend.run("decoder", feeds, into=into,
                               held=self.kv.held(self._held_feeds, (self.cross, self.mask)))
        return self._read_logits(out, own, last)

    def finish(self) -> None:
        """The cross K/V and the encoder mask are this generation's alone: neither they nor the `Held` made
        with them stay with the buffers a later state may take."""
        self.kv.finish(held_too=True)
        self.cross, self.mask = [], None

    def _held_feeds(self) -> dict[str, Any]:
        """What a step feeds unchanged beside the self cache: the cross K/V and the encoder mask (its rows
        written in place when a request takes a slot, which a buffer bound by pointer sees)."""
        return {**dict(zip(self.cross_names, self.cross)), "encoder_attention_mask": self.mask}

    def room_for(self, other: Seq2SeqState) -> bool:
        return bool(self.kv.buffers) and other.mask.shape[1] <= self.mask.shape[1]

    def place(self, other: Seq2SeqState, pairs: list[tuple[int, int]]) -> None:
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
        self.kv.reorder(index)
        self.mask = self.mask[index]
        used = self.mask.bool().any(dim=0)
        width = int(used.nonzero().max()) + 1 if used.any() else self.mask.shape[1]
        self.mask = self.mask[:, :width].contiguous()
        self.cross = [self.backend.view(v)[index.to(self.backend.view(v).device), :, :width].contiguous()
                      for v in self.cross]  # bound by pointer at every step: a copy is made once, here
