"""Side-by-side timing: warm-up, then runs interleaved A B A B so machine drift hits every system alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved(systems: dict[str, Callable[[], object]], runs: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per run for each system; every system runs once per round, in turn."""
    for fn in systems.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(runs):
        for name, fn in systems.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)
