"""The schedulers alone, driven by a fake runner: who joins, who leaves, and when."""

from __future__ import annotations

import pytest

from hotrod.serve.messages import Params, QueueFull
from hotrod.serve.scheduler import ContinuousScheduler, DynamicBatcher, Request

EOS = 99


class _Ticket:
    cancelled = False


class FakeRunner:
    """Token t of a request is (first prompt id + t) % 50; a prompt starting with 42 emits EOS at t == 2.

    Like the real runner it executes plans: it holds slots, and a step must name exactly the rows in them.
    """

    def __init__(self):
        self.rows: list[Request] = []  # its slots
        self.batches: list[list[int]] = []  # request ids of every call

    def release(self, requests):
        self.rows = [r for r in self.rows if r not in requests]

    def admit(self, requests):
        self.rows += requests
        self.batches.append([r.id for r in requests])
        return [self._token(r, 0) for r in requests]

    def step(self, requests):
        assert sorted(r.id for r in requests) == sorted(r.id for r in self.rows), "the plan and the slots differ"
        self.batches.append([r.id for r in requests])
        return [self._token(r, len(r.tokens)) for r in requests]

    @staticmethod
    def _token(request, t):
        if request.prompt[0] == 42 and t == 2:
            return EOS
        return (request.prompt[0] + t) % 50


def _request(first: int, new: int, prompt_len: int = 4, beams: int = 1) -> Request:
    return Request(_Ticket(), prompt=[first] * prompt_len, params=Params(max_new_tokens=new, num_beams=beams))


def _drive(scheduler, runner, arrivals: dict[int, list[Request]], steps: int = 200) -> list[Request]:
    """The worker's iteration: step the running rows, then admit; `arrivals[i]` arrive before iteration i."""
    whole = []
    for i in range(steps):
        for request in arrivals.get(i, []):
            scheduler.add(request)
        plan = scheduler.plan()
        runner.release(plan.release)
        if plan.step:
            _record(scheduler, plan.step, runner.step(plan.step))
        if plan.admit:
            _record(scheduler, plan.admit, runner.admit(plan.admit))
        if plan.whole:
            whole.append(plan.whole)
        if not scheduler.busy() and i > max(arrivals, default=0):
            break
    runner.release(scheduler.plan().release)
    return whole


def _record(scheduler, rows, tokens) -> None:
    for row, token in zip(rows, tokens):
        scheduler.record(row, token)


def test_continuous_joins_the_running_batch_and_leaves_at_once():
    scheduler, runner = ContinuousScheduler(8, 10**6, 100, (EOS,)), FakeRunner()
    long, short, late = _request(1, 10), _request(2, 2), _request(3, 3)
    _drive(scheduler, runner, {0: [long, short], 3: [late]})
    assert long.tokens == [(1 + t) % 50 for t in range(10)] and long.finish_reason == "length"
    assert short.tokens == [2, 3] and late.tokens == [3, 4, 5]
    # `late` arrived while `long` was running and was admitted at once, not after `long` finished
    joined = next(i for i, b in enumerate(runner.batches) if b == [late.id])
    assert long.id in runner.batches[joined + 1] and late.id in runner.batches[joined + 1]
    # `short` finished after 2 tokens and was not stepped again
    assert sum(short.id in b for b in runner.batches) == 2


def test_eos_finishes_a_request_without_returning_it():
    scheduler, runner = ContinuousScheduler(8, 10**6, 100, (EOS,)), FakeRunner()
    stops = _request(42, 10)
    _drive(scheduler, runner, {0: [stops]})
    assert stops.tokens == [42 % 50, 43 % 50] and stops.finish_reason == "stop"


def test_request_level_batching_waits_for_the_whole_batch():
    scheduler, runner = ContinuousScheduler(8, 10**6, 100, (EOS,), policy="request"), FakeRunner()
    long, late = _request(1, 6), _request(3, 2)
    _drive(scheduler, runner, {0: [long], 1: [late]})
    first_late = next(i for i, b in enumerate(runner.batches) if late.id in b)
    assert all(long.id not in b for b in runner.batches[first_late:])
    assert late.tokens == [3, 4]


def test_no_batching_runs_one_at_a_time():
    scheduler, runner = ContinuousScheduler(8, 10**6, 100, (EOS,), policy="none"), FakeRunner()
    requests = [_request(i, 3) for i in range(4)]
    _drive(scheduler, runner, {0: requests})
    assert all(len(b) == 1 for b in runner.batches)
    assert all(len(r.tokens) == 3 for r in requests)


def test_row_limit_and_kv_budget_bound_the_running_batch():
    scheduler, runner = ContinuousScheduler(3, 10**6, 100, (EOS,)), FakeRunner()
    _drive(scheduler, runner, {0: [_request(i, 4) for i in range(7)]})
    assert max(len(b) for b in runner.batches) == 3
    # budget: 2 rows of footprint 4 + 6 = 10 positions, held as 64 by the cache, fit in 128, a third does not
    scheduler, runner = ContinuousScheduler(8, 128, 100, (EOS,)), FakeRunner()
    requests = [_request(i, 6) for i in range(5)]
    _drive(scheduler, runner, {0: requests})
    assert max(len(b) for b in runner.batches) == 2
    assert all(len(r.tokens) == 6 for r in requests)


def test_a_request_larger_than_the_budget_still_runs_alone():
    scheduler, runner = ContinuousScheduler(8, 5, 100, (EOS,)), FakeRunner()
    big = _request(1, 20)
    _drive(scheduler, runner, {0: [big]})
    assert len(big.tokens) == 20


def test_cancelled_requests_leave_waiting_and_running():
    scheduler, runner = ContinuousScheduler(1, 10**6, 100, (EOS,)), FakeRunner()
    running, waiting = _request(1, 50), _request(2, 5)
    scheduler.add(running)
    scheduler.add(waiting)
    runner.admit(scheduler.plan().admit)
    running.ticket.cancelled = waiting.ticket.cancelled = True
    plan = scheduler.plan()
    assert {r.id for r in plan.cancelled} == {running.id, waiting.id} and plan.step == []
    runner.release(plan.release)
    assert not scheduler.busy() and not runner.rows


def test_the_scheduler_alone_says_who_leaves():
    """A finished or failed row stays in the runner's slots until the next plan releases it."""
    scheduler, runner = ContinuousScheduler(8, 10**6, 100, (EOS,)), FakeRunner()
    done, failed, going = _request(1, 1), _request(2, 5), _request(3, 5)
    for request in (done, failed, going):
        scheduler.add(request)
    plan = scheduler.plan()
    _record(scheduler, plan.admit, runner.admit(plan.admit))
    scheduler.fail([failed])
    assert scheduler.running == [going] and len(runner.rows) == 3
    plan = scheduler.plan()
    assert {r.id for r in plan.release} == {done.id, failed.id} and plan.step == [going]
    runner.release(plan.release)
    assert runner.rows == [going]


def test_beam_requests_run_whole_between_steps():
    scheduler, runner = ContinuousScheduler(8, 10**6, 100, (EOS,)), FakeRunner()
    greedy, beam, after = _request(1, 3), _request(2, 3, beams=2), _request(3, 2)
    whole = _drive(scheduler, runner, {0: [greedy, beam, after]})
    assert whole == [beam]
    assert all(beam.id not in b for b in runner.batches)
    assert len(after.tokens) == 2


def test_a_beam_request_at_the_head_of_the_queue_does_not_hold_back_the_others():
    scheduler = ContinuousScheduler(8, 10**6, 100, (EOS,))
    running, beam, behind = _request(1, 5), _request(2, 3, beams=2), _request(3, 2)
    scheduler.add(running)
    scheduler.plan()
    scheduler.add(beam)
    scheduler.add(behind)
    plan = scheduler.plan()
    assert plan.whole is beam and plan.admit == [behind] and plan.step == [running]


def test_the_queue_is_bounded():
    scheduler = ContinuousScheduler(8, 10**6, 2, (EOS,))
    scheduler.add(_request(1, 2))
    scheduler.add(_request(2, 2))
    with pytest.raises(QueueFull):
        scheduler.add(_request(3, 2))


def _embed(length: int, rows: int = 1, at: float = 0.0) -> Request:
    return Request(_Ticket(), rows=[[1] * length] * rows, arrived=at)


def test_dynamic_batcher_waits_for_the_delay_unless_full():
    batcher = DynamicBatcher(max_batch_size=4, max_delay_s=0.01, max_queue=100)
    assert batcher.next_batch(0.0) is None
    batcher.add(_embed(5, at=0.0))
    assert batcher.next_batch(0.004) == pytest.approx(0.006)
    assert len(batcher.next_batch(0.011)) == 1
    for _ in range(4):
        batcher.add(_embed(5, at=1.0))
    assert len(batcher.next_batch(1.0)) == 4  # full: goes at once


def test_dynamic_batcher_groups_similar_lengths_and_respects_rows():
    batcher = DynamicBatcher(max_batch_size=3, max_delay_s=0.0, max_queue=100)
    oldest, long, l12, l11, wide = _embed(10), _embed(100), _embed(12), _embed(11), _embed(10, rows=3)
    for request in (oldest, long, l12, l11, wide):
        batcher.add(request)
    batch = batcher.next_batch(10.0)
    assert batch == [oldest, l11, l12]  # the oldest, then the closest in length; `wide` has too many rows
    assert batcher.next_batch(10.0) == [long]
    assert batcher.next_batch(10.0) == [wide]


def test_dynamic_batcher_is_bounded_and_drops_cancelled():
    batcher = DynamicBatcher(4, 1.0, max_queue=1)
    request = _embed(3)
    batcher.add(request)
    with pytest.raises(QueueFull):
        batcher.add(_embed(3))
    request.ticket.cancelled = True
    assert batcher.drop_cancelled() == [request] and batcher.next_batch(0.0) is None
