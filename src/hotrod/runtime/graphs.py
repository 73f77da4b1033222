"""Calls recorded once and replayed: CUDA graphs for the static engine, the same bookkeeping on a CPU.

A decode step launches a few hundred small kernels; launched one by one from Python, their launch
cost is most of a small model's step. A CUDA graph records the launches once and replays them as one.
It replays on the memory it was recorded with, so every call of a graph is keyed by what it reads:
the shapes of its inputs and the addresses of the tensors it reads and writes in place (the pooled
cache buffers, `hotrod.runtime.pool`). Small inputs (token ids, positions, lengths, masks) are copied
into the graph's own placeholders before each replay; outputs are copied out after it, because the
next replay overwrites them.

A key is recorded the second time it is seen (a one-off call, such as `model(...)` on an odd shape,
is not worth a capture), and at most `limit` graphs are kept, least recently used dropped first.

On a CPU the "graph" is the function itself, called on the same placeholders: the keying, padding
and copying logic is then exercised by the CPU test suite, only the recording differs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

Key = tuple


@dataclass
class GraphStats:
    """What happened to the calls, for tests and for the benchmark's report."""

    eager: int = 0
    captured: int = 0
    replayed: int = 0
    dropped: int = 0


class _Recording:
    """One recorded call: static input placeholders, the tensors bound by address, and the outputs."""

    def __init__(self, fn: Callable[..., Sequence[torch.Tensor]], args: list[torch.Tensor], copied: Sequence[bool],
                 pool=None):
        # Inputs that are copied in get placeholders of their own; the others are used where they are.
        self.inputs = [a.clone() if copy else a for a, copy in zip(args, copied)]
        self.copied = copied
        self.graph = None
        if args and args[0].is_cuda:
            self.graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up off the capture: lazy inits (cuBLAS handles, autotuning)
                fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = list(fn(*self.inputs))
        else:
            self.fn = fn

    def replay(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        for placeholder, value, copy in zip(self.inputs, args, self.copied):
            if copy:
                placeholder.copy_(value, non_blocking=True)
        if self.graph is None:
            return [t.clone() for t in self.fn(*self.inputs)]
        self.graph.replay()
        return [t.clone() for t in self.outputs]


@dataclass
class Graphs:
    """Recorded calls by key (see the module doc); `limit` 0 records nothing."""

    limit: int = 32
    stats: GraphStats = field(default_factory=GraphStats)

    def __post_init__(self):
        self._recorded: OrderedDict[Key, _Recording] = OrderedDict()
        self._seen: set[Key] = set()
        self._pool = None

    def call(self, key: Key, fn: Callable[..., Sequence[torch.Tensor]], args: list[torch.Tensor],
             copied: Sequence[bool]) -> list[torch.Tensor]:
        """fn(*args), replayed from a recording when `key` has one; `copied[i]`: args[i] is copied into a
        placeholder (otherwise it is read where it lies, and its address must be part of `key`)."""
        recording = self._recorded.get(key)
        if recording is None and self.limit and key in self._seen:
            recording = self._record(key, fn, args, copied)
        if recording is None:
            if len(self._seen) > 64 * max(self.limit, 1):  # keys of buffers long gone
                self._seen.clear()
            self._seen.add(key)
            self.stats.eager += 1
            return list(fn(*args))
        self._recorded.move_to_end(key)
        self.stats.replayed += 1
        return recording.replay(args)

    def __len__(self) -> int:
        return len(self._recorded)

    def _record(self, key: Key, fn, args, copied) -> _Recording:
        if args and args[0].is_cuda and self._pool is None:
            # One memory pool for every graph: they replay one at a time, and outputs are copied out.
            self._pool = torch.cuda.graph_pool_handle()
        recording = _Recording(fn, args, copied, self._pool)
        self._recorded[key] = recording
        self.stats.captured += 1
        while len(self._recorded) > self.limit:
            self._recorded.popitem(last=False)
            self.stats.dropped += 1
        return recording
