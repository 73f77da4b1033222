"""Side-by-side timing: warm-up, then runs interleaved (A B C, B C A, C A B, ...) so machine drift hits every
system alike.

Between two timed calls the machine is left idle for a moment: thread pools (OpenMP's, ONNX Runtime's)
keep spinning for a while after their work ends, and without the pause one system's spinning threads
would be timed as part of the next system's run.

It sits below both `hotrod.build.auto` (which times its candidates) and `hotrod.bench` (which times hotrod
against its peers), so that choosing a precision does not import the benchmark.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SETTLE_S = 0.3  # longer than GNU OpenMP's default spin before its threads sleep


def interleaved(systems: dict[str, Callable[[], object]], runs: int, warmup: int = 1,
                settle: float = SETTLE_S) -> dict[str, list[float]]:
    """Seconds per run for each system; every system runs once per round, in turn, the order turned by one
    each round, so that no system always runs first after the pause or always right after the same other one
    (whose caches, threads and memory traffic it would meet every time)."""
    for fn in systems.values():
        for _ in range(warmup):
            fn()
    names = list(systems)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(runs):
        turn = round_ % len(names) if names else 0
        for name in names[turn:] + names[:turn]:
            time.sleep(settle)
            start = time.perf_counter()
            systems[name]()
            times[name].append(time.perf_counter() - start)
    return times


def synchronized(fn: Callable[[], T], device: str) -> Callable[[], T]:
    """`fn`, waiting for the GPU's queued work before it returns, so a timing covers the work, not its launch."""
    if device != "cuda":
        return fn
    import torch

    def call() -> T:
        output = fn()
        torch.cuda.synchronize()
        return output

    return call


def median(values: list[float]) -> float:
    return statistics.median(values)
