"""The runner under a scripted schedule: rows join, fill free slots, merge and leave; tokens never change."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hotrod.generation import cache
from hotrod.generation.feeds import compact_prompts
from hotrod.serve.messages import Params
from hotrod.serve.runner import GenerationRunner
from hotrod.serve.scheduler import ContinuousScheduler, Request


class _Ticket:
    cancelled = False


@pytest.fixture
def calls(monkeypatch):
    """How often each state operation ran, so the test knows every path was taken."""
    counts = {"join": 0, "keep": 0, "place": 0, "most_joined": 0}
    for cls in (cache.DecoderState, cache.Seq2SeqState):
        for name in ("join", "keep", "place"):
            original = getattr(cls, name)

            def counted(self, *args, _original=original, _name=name):
                counts[_name] += 1
                if _name == "join":  # how many states one join took in at once
                    counts["most_joined"] = max(counts["most_joined"], len(args[0]))
                return _original(self, *args)

            monkeypatch.setattr(cls, name, counted)
    return counts


def _alone(model, request: Request, eos) -> list[int]:
    out = model.generate(torch.tensor([request.prompt]), max_new_tokens=request.params.max_new_tokens)
    tokens = out[0, len(request.prompt) if model.kind == "decoder" else 1 :].tolist()
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos), tokens)


@pytest.mark.parametrize("burst", [1, 3], ids=["one_by_one", "bursts"])
def test_rows_joining_and_leaving_keep_each_rows_tokens(lm_case, backend, zoo, calls, burst):
    """Requests arrive one every other step, or three at a time (prefilled in parts by length, then
    joined to the running rows in one join)."""
    model = zoo.model(lm_case, backend)
    runner = GenerationRunner(model)
    scheduler = ContinuousScheduler(4 if burst == 1 else 8, 10**6, 100, runner.eos_ids)
    generator = torch.Generator().manual_seed(1)
    # In bursts, a long prompt arrives with two short ones: prefilled in two parts (`hotrod.batching.plan`).
    lengths = [3, 11, 5, 9, 4, 10, 6, 2] if burst == 1 else [3, 40, 4, 2, 45, 5, 3, 38]
    news = [12, 3, 9, 5, 11, 4, 7, 6]
    requests = [Request(_Ticket(), prompt=torch.randint(2, 100, (n,), generator=generator).tolist(),
                        params=Params(max_new_tokens=new)) for n, new in zip(lengths, news)]
    for request in requests:
        request.options = runner.options(request.prompt, request.params)
    pending, step = list(requests), 0
    while pending or scheduler.busy():
        if pending and step % 2 == 0:
            for _ in range(min(burst, len(pending))):
                scheduler.add(pending.pop(0))
        _execute(scheduler, runner, scheduler.plan())
        step += 1
    runner.release(scheduler.plan().release)
    for request in requests:
        assert request.tokens == _alone(model, request, runner.eos_ids)
    assert calls["join"] and calls["keep"] and (calls["place"] or burst > 1)
    assert calls["most_joined"] >= burst - 1  # in bursts, one join takes in several prefilled parts
    assert not runner.groups


def run_arriving(scheduler, runner, requests, after_step=lambda: None) -> None:
    """Requests arriving one every other step into a running batch, run until every one is done (and
    `after_step` called after each step); their settings resolved as the worker resolves them."""
    for request in requests:
        request.options = runner.options(request.prompt, request.params)
    pending, step = list(requests), 0
    while pending or scheduler.busy():
        if pending and step % 2 == 0:
            scheduler.add(pending.pop(0))
        _execute(scheduler, runner, scheduler.plan())
        after_step()
        step += 1
    runner.release(scheduler.plan().release)


def _execute(scheduler, runner, plan) -> None:
    """The worker's iteration: the runner executes the plan, the scheduler records every token."""
    runner.release(plan.release)
    for rows, tokens in ((plan.step, runner.step(plan.step) if plan.step else []),
                         (plan.admit, runner.admit(plan.admit) if plan.admit else [])):
        for row, picks in zip(rows, tokens):
            for pick in picks:
                if scheduler.record(row, pick.token):
                    break
    for group in runner.groups:  # sized once for what its rows will need: no step grows the cache
        wanted = max(r.options.settings.max_length for r in group.rows if r is not None)
        assert group.state.kv.capacity >= wanted


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
    assert isinstance(outcomes[0], BaseException) and all(isinstance(p.token, int) for o in outcomes[1:] for p in o)


class _Keeping:
    """A decoding state that records which rows `keep` kept."""

    kept: list[int] | None = None

    def keep(self, index: torch.Tensor) -> None:
        self.kept = index.tolist()


@pytest.mark.parametrize(("rows", "least", "kept"), [
    ([1, None, None, None], 2, [0, 1]),  # a lone row keeps a free slot beside it
    ([1, 1, 1, None, None, None], 2, [0, 1, 2, 3]),  # three live rows keep one free slot: four
    ([1, 1, None, None], 2, [0, 1]),
    ([None, 1, None, 1, 1, None], 1, [1, 3, 4]),
])
def test_compacting_keeps_a_multiple_of_the_invariant_rows(rows, least, kept):
    from hotrod.serve.slots import Group, compact

    group = Group(_Keeping(), [object() if r else None for r in rows])
    compact(group, least=least)
    assert group.state.kept == kept and len(group.rows) == len(kept)


def test_prompts_are_padded_to_a_multiple_of_columns():
    from hotrod.model_inputs import padded_batch

    ids, mask = padded_batch([[5, 6, 7], [8]], left=False, multiple=2)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]] and mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    ids, mask = padded_batch([[5, 6, 7], [8]], left=True, multiple=1)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]


def test_compacted_prompts_are_a_multiple_of_columns_wide():
    ids, columns, lengths = compact_prompts(torch.tensor([[0, 5, 6], [7, 8, 9]]),
                                            torch.tensor([[0, 1, 1], [1, 1, 1]]), multiple=2)
    assert ids.tolist() == [[5, 6, 0, 0], [7, 8, 9, 0]] and lengths.tolist() == [2, 3]
    assert columns[:, :3].tolist() == [[1, 2, 0], [0, 1, 2]]
