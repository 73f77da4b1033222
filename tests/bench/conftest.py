"""Fixtures of the bench tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotrod import timing
from hotrod.bench import harness


@pytest.fixture
def short_settle(monkeypatch):
    """The pause before each timed call matters for real figures, not for checking that figures are made:
    whatever pause a run asks for (`--settle`), a test sleeps a millisecond."""
    def interleaved(systems, runs, warmup=1, settle=timing.SETTLE_S):
        return timing.interleaved(systems, runs=runs, warmup=warmup, settle=min(settle, 0.001))

    monkeypatch.setattr(harness, "interleaved", interleaved)


@pytest.fixture
def no_floor_measurement(monkeypatch):
    """The machine's figures are measured once per machine; the tests use fixed ones."""
    from hotrod.bench.floor import Machine

    fixed = Machine(cpu="test", threads=1, bandwidth_gbs=10.0, matmul_gflops=50.0, int8_gops=100.0, measured="-")
    monkeypatch.setattr(harness, "machine", lambda threads, device="cpu": fixed)


@pytest.fixture
def bench_peer(no_floor_measurement):
    """`hotrod bench` on a checkpoint with one peer, one run on one thread; returns the results' list."""
    def run(checkpoint: Path, out: Path, peer: str, *args: str) -> list[dict]:
        from hotrod.cli import main

        argv = ["bench", str(checkpoint), *args, "--peers", peer, "--runs", "1", "--threads", "1", "--out", str(out)]
        assert main(argv) == 0
        return json.loads((out / "results.json").read_text())["results"]

    return run
