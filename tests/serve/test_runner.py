"""The runner under a scripted schedule: rows join, fill free slots, merge and leave; tokens never change."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hotrod.generation import cache
from hotrod.serve.protocol import Params
from hotrod.serve.runner import GenerationRunner
from hotrod.serve.scheduler import ContinuousScheduler, Request


class _Ticket:
    cancelled = False


@pytest.fixture
def calls(monkeypatch):
    """How often each state operation ran, so the test knows every path was taken."""
    counts = {"join": 0, "keep": 0, "place": 0}
    for cls in (cache.DecoderState, cache.Seq2SeqState):
        for name in counts:
            original = getattr(cls, name)

            def counted(self, *args, _original=original, _name=name):
                counts[_name] += 1
                return _original(self, *args)

            monkeypatch.setattr(cls, name, counted)
    return counts


def _alone(model, request: Request, eos) -> list[int]:
    out = model.generate(torch.tensor([request.prompt]), max_new_tokens=request.params.max_new_tokens)
    tokens = out[0, len(request.prompt) if model.kind == "decoder" else 1 :].tolist()
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos), tokens)


def test_rows_joining_and_leaving_keep_each_rows_tokens(lm_case, backend, zoo, calls):
    model = zoo.model(lm_case, backend)
    runner = GenerationRunner(model)
    scheduler = ContinuousScheduler(4, 10**6, 100, runner.eos_ids)
    generator = torch.Generator().manual_seed(1)
    lengths = [3, 11, 5, 9, 4, 10, 6, 2]
    news = [12, 3, 9, 5, 11, 4, 7, 6]
    requests = [Request(_Ticket(), prompt=torch.randint(2, 100, (n,), generator=generator).tolist(),
                        params=Params(max_new_tokens=new)) for n, new in zip(lengths, news)]
    for request in requests:
        request.options = runner.options(request.prompt, request.params)
    pending, step = list(requests), 0
    while pending or scheduler.busy():
        if pending and step % 2 == 0:
            scheduler.add(pending.pop(0))
        _execute(scheduler, runner, scheduler.plan())
        step += 1
    runner.release(scheduler.plan().release)
    for request in requests:
        assert request.tokens == _alone(model, request, runner.eos_ids)
    assert calls["join"] and calls["keep"] and calls["place"]
    assert not runner.groups


def _execute(scheduler, runner, plan) -> None:
    """The engine's iteration: the runner executes the plan, the scheduler records every token."""
    runner.release(plan.release)
    for rows, tokens in ((plan.step, runner.step(plan.step) if plan.step else []),
                         (plan.admit, runner.admit(plan.admit) if plan.admit else [])):
        for row, pick in zip(rows, tokens):
            scheduler.record(row, pick.token)


def test_a_long_request_leaving_gives_its_cache_memory_back(lm_case, zoo):
    """Cache buffers are sized for the longest request in them; once it leaves they shrink to what the
    rows left may need, so the server's cache budget holds, and those rows decode on unchanged."""
    model = zoo.model(lm_case, "onnxruntime")
    runner = GenerationRunner(model)
    scheduler = ContinuousScheduler(4, 10**6, 100, runner.eos_ids)
    long, short = (Request(_Ticket(), prompt=list(range(5, 5 + n)), params=Params(max_new_tokens=new))
                   for n, new in ((4, 50), (3, 12)))
    for request in (long, short):
        request.options = runner.options(request.prompt, request.params)
        scheduler.add(request)
    _execute(scheduler, runner, scheduler.plan())
    [group] = runner.groups
    assert group.state.kv.capacity >= long.options.settings.max_length
    long.ticket.cancelled = True
    plan = scheduler.plan()
    runner.release(plan.release)
    assert group.state.kv.capacity == short.options.settings.max_length
    _execute(scheduler, runner, replace(plan, release=[]))
    while scheduler.busy():
        _execute(scheduler, runner, scheduler.plan())
    assert short.tokens == _alone(model, short, runner.eos_ids)


def test_a_row_whose_choice_fails_fails_alone(zoo):
    """A sampled row whose draw raises gets the exception as its outcome; its batch-mates their tokens."""
    model = zoo.model("gpt2", "onnxruntime")
    runner = GenerationRunner(model)
    rows = [Request(_Ticket(), prompt=[5, 6, 7], params=Params(max_new_tokens=4, do_sample=True, seed=s))
            for s in (1, 2)] + [Request(_Ticket(), prompt=[8, 9], params=Params(max_new_tokens=4))]
    for request in rows:
        request.options = runner.options(request.prompt, request.params)
    rows[0].options.generator = "not a generator"  # its draw raises inside torch.multinomial
    outcomes = runner.admit(rows)
    assert isinstance(outcomes[0], BaseException) and all(isinstance(p.token, int) for p in outcomes[1:])
