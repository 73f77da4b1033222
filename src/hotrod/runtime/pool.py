"""Cache buffers for the static engine, lent from a pool so their addresses repeat.

A captured CUDA graph reads and writes memory by address. The decoding states ask the backend for a
new buffer at every request (`Backend.empty`); if each came from the allocator afresh, a graph captured
for one request would never fit the next. The pool hands out the leading rows of a *base* buffer whose
row count is a batch bucket, and takes the base back once the view it lent is gone, so the next request
of the same shape gets the same memory, and the graph captured for it replays.

Bucketing the rows also bounds the graphs to one per bucket: a batch of 5 runs as the bucket of 8,
rows 5..7 idle (length 0, never read).
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict

import torch


def batch_bucket(rows: int) -> int:
    """1, 2, 4, then multiples of 8: few graphs, and at most 7 idle rows past 8."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if rows <= 4:
        return 1 << (rows - 1).bit_length()
    return -(-rows // 8) * 8


class CachePool:
    """Zero-filled buffers of `dtype` on `device`, lent as `base[:rows]` views of bucketed bases.

    A base is lent again once the view lent from it has been collected. At most `keep_bytes` of free
    bases are kept (oldest shapes dropped first): a server sees many capacities over a day.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, keep_bytes: int = 1 << 30):
        self.device, self.dtype, self.keep_bytes = device, dtype, keep_bytes
        self._free: OrderedDict[tuple[int, ...], list[torch.Tensor]] = OrderedDict()
        self._free_bytes = 0
        self._lent: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        # Keys of lent views that have died, told by their weakrefs: a take looks at these only, not at
        # every buffer lent (a beam step reorders every layer's cache, taking as many buffers again).
        self._dead: list[int] = []

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A zeroed tensor of `shape` whose first axis is rows of a pooled base (see `base_of`)."""
        self._collect()
        full = (batch_bucket(shape[0]), *shape[1:])
        bases = self._free.get(full)
        if bases:
            # The lowest address first: a request's buffers come back in any order, and taking them in
            # address order gives each layer the memory it had last time (the graphs' keys).
            base = bases.pop(min(range(len(bases)), key=lambda i: bases[i].data_ptr()))
            self._free_bytes -= _nbytes(base)
            if not bases:
                del self._free[full]
        else:
            base = torch.empty(full, device=self.device, dtype=self.dtype)
        # Zeros, not stale memory: attention multiplies masked positions by a zero weight, and a NaN
        # left there would survive it.
        base.zero_()
        view = base[: shape[0]]
        key = id(view)
        self._lent[key] = (weakref.ref(view, functools.partial(_died, self._dead, key)), base)
        return view

    def base_of(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The pooled base `tensor` was lent from, or None when it was not lent by this pool."""
        entry = self._lent.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        return entry[1]

    @property
    def lent(self) -> int:
        self._collect()
        return len(self._lent)

    def _collect(self) -> None:
        while self._dead:
            key = self._dead.pop()
            entry = self._lent.get(key)
            if entry is None or entry[0]() is not None:  # already taken back, or the id now names a new view
                continue
            del self._lent[key]
            base = entry[1]
            self._free.setdefault(tuple(base.shape), []).append(base)
            self._free.move_to_end(tuple(base.shape))
            self._free_bytes += _nbytes(base)
        self._trim()

    def _trim(self) -> None:
        while self._free_bytes > self.keep_bytes and self._free:
            shape, bases = next(iter(self._free.items()))
            self._free_bytes -= _nbytes(bases.pop(0))
            if not bases:
                del self._free[shape]


def _died(dead: list[int], key: int, _ref: weakref.ref) -> None:
    """A lent view's weakref callback; given the list, not the pool, so it keeps no pool alive."""
    dead.append(key)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
