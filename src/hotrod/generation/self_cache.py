"""The self-attention KV cache: a buffer per layer that the graph updates in place, and each row's length.

Each row has its own length, so a step reads each row's cache once and copies nothing, and rows that
began at different steps share a batch with no padding. Rows join, take free slots, leave and are
dropped (continuous batching) with one copy of cache rows per arrival or departure, never per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hotrod.contracts import kv_names
from hotrod.generation.feeds import int32_scalar
from hotrod.registry import Dims
from hotrod.runtime.base import Backend, Held

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
        and advances it there, without a torch call (see `hotrod.generation.feeds`)."""
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
        asks it every step, and a tensor's answer is a whole torch call where the bool's is none."""
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
        and binding them afresh is a large share of a short generation's time outside its graph runs (a
        small model's most of all). What the last generation wrote is zeroed: the state
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
        return {"seqlens_k": seqlens.astype(np.int32), "total_sequence_length": int32_scalar(total)}

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
        """Keep rows `index` (on the device the beams were chosen on; the lengths read them on the host, first,
        before the buffers' copies are queued behind the read)."""
        host = index.cpu()
        self.buffers = [self.backend.select(value, index) for value in self.buffers]
        self.lengths, self.idle = self.lengths[host], self.idle[host]

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
