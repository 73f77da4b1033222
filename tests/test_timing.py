"""hotrod.timing.interleaved: every system once a round, the order turned by one each round."""

from __future__ import annotations

from hotrod import timing


def _systems(calls: list[str]) -> dict:
    return {name: (lambda name=name: calls.append(name)) for name in "abc"}


def test_each_system_runs_once_a_round_in_a_turning_order():
    calls: list[str] = []
    times = timing.interleaved(_systems(calls), runs=4, warmup=0, settle=0.0)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert list(times) == ["a", "b", "c"] and all(len(t) == 4 and min(t) >= 0.0 for t in times.values())


def test_the_warm_up_runs_each_system_before_any_timed_round():
    calls: list[str] = []
    timing.interleaved(_systems(calls), runs=1, warmup=2, settle=0.0)
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"] and sorted(calls[6:]) == ["a", "b", "c"]


def test_no_systems_no_times():
    assert timing.interleaved({}, runs=3, warmup=0, settle=0.0) == {}
