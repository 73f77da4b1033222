"""Finished generations' decoding states, whose cache buffers the next generate() calls start in.

Making a state's cache buffers, zeroing them and binding them to the graph is a sizeable share of a short
call's time outside its graph runs on a small model. A finished call gives
its state here; the next call takes the latest one given and starts in its buffers where they fit
(`DecodingState.recycle`), zeroed where the last call wrote, still bound on the thread that ran it. The
states kept hold at most `budget` bytes in all (the oldest let go first), whatever the number of threads
calling, and `clear` lets every one go.
"""

from __future__ import annotations

import threading

from hotrod.generation.state import DecodingState


class Spares:
    """States given back by finished calls, the latest taken first; a lock keeps two calls from taking one."""

    def __init__(self, budget: int):
        self.budget = budget
        self._kept: list[tuple[DecodingState, int]] = []  # (state, its buffers' bytes), oldest first
        self._lock = threading.Lock()

    def take(self) -> DecodingState | None:
        with self._lock:
            return self._kept.pop()[0] if self._kept else None

    def give(self, state: DecodingState) -> None:
        """Keep `state` (finished: `DecodingState.finish` has let go of what only its call used) unless it is
        over the budget alone; older ones go while the whole is."""
        size = state.nbytes()
        if size > self.budget:
            return
        with self._lock:
            self._kept.append((state, size))
            while sum(kept for _, kept in self._kept) > self.budget:
                self._kept.pop(0)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)
