"""The one interface every backend satisfies.

A backend runs the named graphs of a kind's contract (`hotrod.contracts`). Values it returns are
opaque handles (an OrtValue, a torch tensor on some device) that can be fed straight back in, so the
KV cache never leaves the backend between steps; `to_torch` is called only for what the decoding loop
reads (logits, hidden states). Nothing outside `hotrod.runtime` imports onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hotrod.contracts import GraphIO
from hotrod.errors import HotrodError, check_bool, check_count


@dataclass(frozen=True)
class RuntimeOptions:
    """How to run a model: which backend, on which device, with how many CPU threads (0: all cores).

    For the torch backend: `static` runs the static engine (`hotrod.runtime.static`: cast weights,
    pooled caches, recorded calls), None meaning on a GPU only (on a CPU, eager fp32 is the reference
    the others are checked against); `precision` is the engine's weights; `compile` adds torch.compile.
    `profile` has onnxruntime record every node's time (`hotrod.bench.ops` reads it).
    """

    backend: str = "onnxruntime"
    device: str = "cpu"
    threads: int = 0
    precision: str = "fp32"
    static: bool | None = None
    profile: bool = False

    def __post_init__(self):
        check_threads(self.threads)
        if self.static is not None:
            check_bool("static", self.static)
        check_bool("profile", self.profile)
        if self.static is not None and self.backend != "torch":  # the static engine is the torch backend's
            raise HotrodError(f"static applies to the torch backend's engine, not to {self.backend}")
        if self.profile and self.backend != "onnxruntime":
            raise HotrodError("profile reads onnxruntime's profiler: it needs the onnxruntime backend")

    @property
    def uses_static_engine(self) -> bool:
        return self.static if self.static is not None else self.device != "cpu"


class Backend(Protocol):
    contracts: dict[str, GraphIO]
    device: str
    # Torch threads the decoding loop should use around this backend's runs, or None to leave torch alone.
    # A CPU engine with its own thread pool wants 1: the loop's vocab-sized ops gain nothing from threads,
    # and torch's idle workers spinning on the same cores slow the engine down.
    loop_threads: int | None
    # Whether a decoder step may feed several tokens after the cache (drafts verified in one pass,
    # `hotrod.generation.drafts`): the static engine's fixed-span attention reads one token a step.
    verifies_drafts: bool
    # Whether such a pass may hold several rows (the server verifies its whole batch in one): onnxruntime's
    # GroupQueryAttention takes several new tokens after a cache only at batch size 1.
    verifies_batches: bool
    # Whether `run` writes any output named in `into` where it lies, without a copy (a step's logits into a
    # buffer of the decoding state's own); elsewhere only the cache buffers a graph updates in place.
    binds_outputs: bool
    # Whether it lends cache buffers from a pool of its own, each back in the pool once let go (the static
    # engine, whose recorded graphs are keyed by their addresses): a finished generate() then keeps none
    # for the next call (`HotrodModel._generation_state`), which would hold them out of the pool.
    pools_cache: bool
    # Whether it runs several greedy steps in one call, each fed the argmax of the one before (`chain`): the
    # static engine, which records them as one graph, so that the host launches them at once.
    chains_steps: bool
    # Whether an encoder-decoder's step may read one cross K/V and encoder mask per source for that source's
    # rows (beams, samples; `hotrod.models.seq2seq`): the static engine pads every feed to its batch bucket,
    # so it takes a copy per row.
    shares_sources: bool
    # What one more call costs, in tokens' worth of compute: a padded encoder batch is split into sub-batches
    # of similar length where padding would cost more (`hotrod.batching.plan`). A recorded GPU engine
    # pays per call, and per distinct shape a recording, far more than padding costs it.
    call_overhead_tokens: int

    def run(self, graph: str, feeds: Mapping[str, Any], into: Mapping[str, Any] | None = None,
            held: Held | None = None) -> dict[str, Any]:
        """Run one graph; `feeds` holds torch tensors or handles returned by an earlier run.

        Outputs named in `into` are written into those handles (a cache buffer that the graph updates in
        place is both a feed and its own output); the others are allocated by the backend. `held` adds
        feeds and such outputs that stay the same from one run to the next (`Held`); what it writes to is
        not returned.
        """

    def chain(self, graph: str, tokens: torch.Tensor, token: str, plans: list[Mapping[str, Any]],
              held: Held | None, pick: Any) -> torch.Tensor:
        """Where `chains_steps`: `len(plans)` greedy steps of `graph`, step j on the feeds of `plans[j]` and its
        `token` feed the previous step's choice, `pick(logits [rows, vocab], j, *pick.bound, *pick.tensors)`
        (the first step's: `tokens` [rows]); returns each step's choice [rows, steps]. `pick.bound` are read
        where they lie (their addresses part of a recording's key), `pick.tensors` copied in at each call,
        `pick.key` names whatever else the choice depends on (`hotrod.generation.chain_pick.ChainPick`)."""

    def empty(self, shape: tuple[int, ...]) -> Any:
        """A new zero-filled float32 handle of `shape` on the backend's device (a cache buffer)."""

    def to_torch(self, value: Any) -> torch.Tensor:
        """A handle's contents as a float or integer torch tensor."""

    def view(self, value: Any) -> torch.Tensor:
        """A handle's contents without a copy, valid only while the handle lives (for an immediate copy)."""

    def select(self, value: Any, index: torch.Tensor) -> Any:
        """Rows `index` of a handle along the batch axis (beam expansion and reordering)."""


@dataclass(frozen=True, eq=False)
class Held:
    """Feeds, and outputs written in place, that a run shares with the runs before and after it: a decoding
    state's cache buffers (and an encoder-decoder's cross K/V and encoder mask), made again whenever one of
    them is replaced, never changed. A backend that binds its inputs keeps a `Held` bound while the next
    run brings the very same object, so a step binds and checks only its few small feeds (every layer's
    buffers, checked one by one, were most of a step's time outside onnxruntime); others merge it
    (`merged`). Its entries must not be replaced in place (resized, or given other storage)."""

    feeds: Mapping[str, Any]
    into: Mapping[str, Any]
    names: frozenset[str] = field(init=False)  # the feeds' and outputs' names

    def __post_init__(self):
        object.__setattr__(self, "names", frozenset(self.feeds) | frozenset(self.into))


def merged(feeds: Mapping[str, Any], into: Mapping[str, Any] | None,
           held: Held | None) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """`feeds` and `into` with `held`'s entries added, for a backend that binds nothing between runs."""
    if held is None:
        return feeds, into
    return {**feeds, **held.feeds}, {**(into or {}), **held.into}


MAX_THREADS = 256  # past any CPU here: thousands of pool threads take a session minutes to start


def check_threads(requested: int) -> int:
    """A thread count a pool can start: a whole number in [0, MAX_THREADS], or up to this machine's CPUs where
    it has more (0: every core)."""
    import os

    most = max(MAX_THREADS, os.cpu_count() or 1)
    if check_count("threads", requested, 0) > most:
        raise HotrodError(f"threads must be at most {most}, got {requested}")
    return requested


def cpu_threads(requested: int) -> int:
    """`requested`, or every core this process may use when 0."""
    if check_threads(requested):
        return requested
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def contract_of(contracts: Mapping[str, GraphIO], graph: str, feeds: Mapping[str, Any]) -> GraphIO:
    """The contract of `graph`, once `feeds` holds every input it names (a KeyError naming those missing)."""
    io = contracts[graph]
    missing = [name for name in io.input_names if name not in feeds]
    if missing:
        raise KeyError(f"graph {graph} needs inputs {missing}")
    return io
