"""The real worker on tiny models: batched requests get exactly the tokens each gets alone.

Requests are submitted concurrently to a ModelWorker (and once through the HTTP app), with arrivals
spread over time so that rows join and leave a running batch of differing cache lengths.
"""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import torch

from hotrod.errors import HotrodError
from hotrod.pipelines.base import Row
from hotrod.serve import picks as picks_module
from hotrod.serve.app import create_app
from hotrod.serve.messages import BatchFailed, Params, QueueFull, ShuttingDown, WorkerDown
from hotrod.serve.runner import GenerationRunner
from hotrod.serve.scheduler import Request
from hotrod.serve.worker import ModelWorker, ServeOptions

OPTIONS = ServeOptions(max_batch_size=4, max_queue_delay_ms=2.0, max_queue=64)


def _workload(vocab: int, count: int = 10, seed: int = 0) -> list[tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (count,), generator=generator).tolist()
    news = torch.randint(1, 12, (count,), generator=generator).tolist()
    return [(torch.randint(2, vocab, (n,), generator=generator).tolist(), new) for n, new in zip(lengths, news)]


def _alone(model, prompt: list[int], params: Params, eos: tuple[int, ...]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), **params.generate_kwargs())
    start = len(prompt) if model.kind == "decoder" else 1
    tokens = out[0, start:].tolist()
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i]
    return tokens


async def _collect(ticket) -> tuple[list[int], str | None, BaseException | None]:
    tokens: list[int] = []
    async for event in ticket.events():
        tokens += event.tokens
        if event.finish_reason or event.error:
            return tokens, event.finish_reason, event.error
    return tokens, None, None


async def _serve_all(worker, requests, spacing: float = 0.01):
    async def one(i, prompt, params):
        await asyncio.sleep(i * spacing)  # staggered: rows join a batch already running
        return await _collect(worker.submit_generate(prompt, params))

    return await asyncio.gather(*(one(i, p, params) for i, (p, params) in enumerate(requests)))


@pytest.fixture
def worker_for(zoo, started):
    def make(name: str, backend: str = "onnxruntime", options: ServeOptions = OPTIONS) -> ModelWorker:
        return started(ModelWorker(name, zoo.model(name, backend), options))

    return make


def test_concurrent_greedy_matches_each_request_alone(lm_case, backend, worker_for):
    worker = worker_for(lm_case, backend)
    requests = [(p, Params(max_new_tokens=n)) for p, n in _workload(worker.info.vocab_size)]
    results = asyncio.run(_serve_all(worker, requests))
    eos = worker.runner.eos_ids
    for (prompt, params), (tokens, reason, error) in zip(requests, results):
        assert error is None and reason in ("length", "stop")
        assert tokens == _alone(worker.model, prompt, params, eos)
    assert max(worker.metrics.batch_size.collect()[0].samples, key=lambda s: s.value).value > 0


def test_seeded_sampling_and_beams_share_the_batch_with_greedy(worker_for):
    worker = worker_for("gpt2")
    vocab, eos = worker.info.vocab_size, worker.runner.eos_ids
    work = _workload(vocab, count=6, seed=1)
    params = [Params(max_new_tokens=8), Params(max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20, seed=7),
              Params(max_new_tokens=6, num_beams=3), Params(max_new_tokens=8, repetition_penalty=1.3),
              Params(max_new_tokens=8, do_sample=True, top_p=0.9, seed=3), Params(max_new_tokens=5)]
    requests = [(prompt, p) for (prompt, _), p in zip(work, params)]
    batched = asyncio.run(_serve_all(worker, requests, spacing=0.0))
    alone = [asyncio.run(_serve_all(worker, [r]))[0] for r in requests]
    assert [b[0] for b in batched] == [a[0] for a in alone]  # a seeded sample does not depend on its neighbours
    for (prompt, p), (tokens, _, _) in zip(requests, batched):
        if not p.do_sample:
            assert tokens == _alone(worker.model, prompt, p, eos)


def test_a_seeded_beam_sample_draws_from_its_own_stream(worker_for):
    """A beam search that samples takes its request's seed, as a sampled row does: the same seed the same
    tokens, whatever was drawn in between."""
    worker = worker_for("gpt2")
    prompt = _workload(worker.info.vocab_size, count=1, seed=2)[0][0]

    def run(seed: int) -> list[int]:
        params = Params(max_new_tokens=8, do_sample=True, num_beams=2, temperature=5.0, top_k=0, seed=seed)
        torch.rand(7)  # the process's own stream moves between requests
        return asyncio.run(_serve_all(worker, [(prompt, params)]))[0][0]

    first = run(4)
    assert run(4) == first
    assert any(run(seed) != first for seed in (5, 6, 7)), "the seed does not reach the beams' draws"


def test_streamed_tokens_equal_the_whole_answer_over_http(worker_for):
    worker = worker_for("t5")
    app = create_app({"t5": worker})

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"token_ids": [5, 6, 7, 8], "max_new_tokens": 6}
            whole = (await client.post("/v1/generate", json=body)).json()
            streamed = await client.post("/v1/generate", json={**body, "stream": True})
        return whole, streamed

    whole, streamed = asyncio.run(go())
    chunks = [line[6:] for line in streamed.text.split("\n\n") if line.startswith("data: ")]
    import json

    tokens = [t for chunk in chunks[:-1] for t in json.loads(chunk)["token_ids"]]
    assert chunks[-1] == "[DONE]" and tokens == whole["token_ids"] and len(tokens) >= 1


def test_a_failing_step_fails_only_its_batch(worker_for, monkeypatch):
    worker = worker_for("gpt2")
    real_step, calls = worker.runner.step, []

    def flaky(requests):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("kernel exploded")
        return real_step(requests)

    monkeypatch.setattr(worker.runner, "step", flaky)
    first = asyncio.run(_serve_all(worker, [([5, 6, 7], Params(max_new_tokens=6))]))[0]
    assert isinstance(first[2], BatchFailed) and "kernel exploded" in str(first[2])
    again = asyncio.run(_serve_all(worker, [([5, 6, 7], Params(max_new_tokens=6))]))[0]
    assert again[2] is None and again[0] == _alone(worker.model, [5, 6, 7], Params(max_new_tokens=6),
                                                   worker.runner.eos_ids)


def test_cancel_frees_the_slot(worker_for):
    worker = worker_for("gpt2")

    async def go():
        ticket = worker.submit_generate([5, 6, 7], Params(max_new_tokens=60))
        async for event in ticket.events():
            if event.tokens:
                ticket.cancel()
            if event.finish_reason or event.error:
                return event.finish_reason

    assert asyncio.run(go()) == "cancelled"
    assert not worker.scheduler.busy()
    worker.stop()
    assert not worker.runner.slots()


def test_drain_finishes_queued_and_running_requests(worker_for):
    worker = worker_for("gpt2", options=ServeOptions(max_batch_size=2, max_queue=64))

    async def go():
        tickets = [worker.submit_generate(p, Params(max_new_tokens=n)) for p, n in _workload(100, count=6)]
        stopping = asyncio.get_running_loop().run_in_executor(None, worker.stop, True)
        results = await asyncio.gather(*(_collect(t) for t in tickets))
        await stopping
        return results

    results = asyncio.run(go())
    assert all(r[1] in ("length", "stop") and r[2] is None for r in results)


def test_overload_is_refused_and_nothing_is_lost(worker_for):
    worker = worker_for("gpt2", options=ServeOptions(max_batch_size=2, max_queue=3))

    async def go():
        accepted, refused = [], 0
        for prompt, new in _workload(100, count=12):
            try:
                accepted.append(worker.submit_generate(prompt, Params(max_new_tokens=new)))
            except QueueFull:
                refused += 1
        results = await asyncio.wait_for(asyncio.gather(*(_collect(t) for t in accepted)), timeout=60)
        return refused, results

    refused, results = asyncio.run(go())
    assert refused > 0 and len(results) + refused == 12
    assert all(r[1] in ("length", "stop") for r in results)


def test_concurrent_embeddings_match_each_alone(encoder_case, worker_for):
    worker = worker_for(encoder_case)
    rows = [torch.randint(5, worker.info.vocab_size, (n,)).tolist() for n in (3, 9, 4, 12, 5, 7)]

    async def go():
        tickets = [worker.submit_embed([row], "mean", True) for row in rows]
        return [(await _last(t)).result for t in tickets]

    batched = asyncio.run(go())
    for row, vectors in zip(rows, batched):
        alone = worker.model.embed([row], pooling="mean", normalize=True)
        torch.testing.assert_close(vectors, alone, atol=1e-5, rtol=1e-4)


def _rows(vocab: int, lengths: tuple[int, ...], seed: int = 0) -> list[Row]:
    generator = torch.Generator().manual_seed(seed)
    return [Row(torch.randint(5, vocab, (n,), generator=generator).tolist()) for n in lengths]


def test_concurrent_rows_match_each_alone(head_case, worker_for):
    """Requests of task rows (one, two or three rows each) share batches; each row gets its own outputs."""
    worker = worker_for(head_case, "torch", ServeOptions(max_batch_size=16, max_queue_delay_ms=50.0))
    rows = _rows(worker.info.vocab_size, (3, 9, 4, 12, 5, 7))
    requests = [rows[:1], rows[1:3], rows[3:6]]

    async def go():
        tickets = [worker.submit_rows(r) for r in requests]
        return [(await _last(t)).result for t in tickets]

    for request, outputs in zip(requests, asyncio.run(go())):
        alone = worker.model.run_rows(request)
        assert len(outputs) == len(request)
        for got, expected in zip(outputs, alone):
            assert got.keys() == expected.keys()
            for name in expected:
                torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4)
    assert max(worker.metrics.batch_size.collect()[0].samples, key=lambda s: s.value).value > 1


def test_embeddings_and_rows_share_a_batch_and_each_gets_its_own(worker_for):
    worker = worker_for("bert", "torch", ServeOptions(max_batch_size=16, max_queue_delay_ms=200.0))
    rows = _rows(worker.info.vocab_size, (4, 6))

    async def go():
        embed = worker.submit_embed([rows[0].input_ids], "mean", False)
        heads = worker.submit_rows(rows)
        return (await _last(embed)).result, (await _last(heads)).result

    vectors, outputs = asyncio.run(go())
    torch.testing.assert_close(vectors, worker.model.embed([rows[0].input_ids]), atol=1e-5, rtol=1e-4)
    for got, expected in zip(outputs, worker.model.run_rows(rows)):
        torch.testing.assert_close(got["last_hidden_state"], expected["last_hidden_state"], atol=1e-5, rtol=1e-4)
    counts = [s for s in worker.metrics.batch_size.collect()[0].samples if s.name.endswith("_count")]  # calls
    assert counts[0].value == 1


async def _last(ticket):
    async for event in ticket.events():
        last = event
    return last


def test_beam_requests_end_at_their_first_eos(seq2seq_case, worker_for):
    worker = worker_for(seq2seq_case)
    requests = [(prompt, Params(max_new_tokens=new, num_beams=3)) for prompt, new in _workload(100, count=3)]
    for (prompt, params), (tokens, reason, error) in zip(requests, asyncio.run(_serve_all(worker, requests))):
        assert error is None and reason in ("length", "stop")
        assert tokens == _alone(worker.model, prompt, params, worker.runner.eos_ids)


# -- isolation: one request's trouble is its own ----------------------------------------------------------

def test_a_row_whose_draw_fails_does_not_fail_its_batch_mates(worker_for, monkeypatch):
    worker = worker_for("gpt2")
    real_pick = picks_module.pick

    def pick(logits, sequence, settings, skip, generator):
        if settings.temperature == 0.5 and sequence.shape[1] >= 5:  # at a step, with its batch-mates running
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real_pick(logits, sequence, settings, skip, generator)

    monkeypatch.setattr(picks_module, "pick", pick)
    good = Params(max_new_tokens=6, do_sample=True, temperature=0.8, seed=3)
    bad = Params(max_new_tokens=6, do_sample=True, temperature=0.5, seed=3)
    greedy = Params(max_new_tokens=6)
    requests = [([5, 6, 7], good), ([5, 6, 7], bad), ([8, 9], greedy)]
    together = asyncio.run(_serve_all(worker, requests, spacing=0.0))
    assert len(together[1][0]) == 2 and isinstance(together[1][2], BatchFailed)
    alone = [asyncio.run(_serve_all(worker, [r]))[0] for r in (requests[0], requests[2])]
    assert [together[0], together[2]] == alone and all(r[2] is None for r in alone)


def test_a_temperature_the_draw_cannot_compute_is_refused_at_submission(worker_for):
    worker = worker_for("gpt2")

    async def go():
        worker.submit_generate([5, 6], Params(max_new_tokens=3, do_sample=True, temperature=1e-300))

    with pytest.raises(HotrodError, match="temperature must be at least"):
        asyncio.run(go())


def test_a_dead_worker_fails_what_it_holds_and_refuses_new_work(worker_for, monkeypatch):
    worker = worker_for("gpt2")

    def broken_plan():
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(worker.scheduler, "plan", broken_plan)

    async def go():
        tokens, reason, error = await _collect(worker.submit_generate([5, 6], Params(max_new_tokens=3)))
        with pytest.raises(WorkerDown):
            worker.submit_generate([5, 6], Params(max_new_tokens=3))
        return error

    assert isinstance(asyncio.run(go()), WorkerDown)
    assert worker.failure() == "scheduler bug" and not worker.ready()


def test_draining_is_bounded_by_the_shutdown_timeout(worker_for, monkeypatch):
    worker = worker_for("gpt2")
    release = threading.Event()
    real_step = worker.runner.step

    def stuck(requests):
        release.wait()
        return real_step(requests)

    monkeypatch.setattr(worker.runner, "step", stuck)

    async def go():
        ticket = worker.submit_generate([5, 6, 7], Params(max_new_tokens=20))
        await asyncio.to_thread(worker.stop, True, 0.2)  # returns although the step never ends
        return await _collect(ticket)

    try:
        assert isinstance(asyncio.run(go())[2], ShuttingDown)
    finally:
        release.set()


def test_a_cancelled_beam_request_stops_during_its_search(zoo):
    model = zoo.model("gpt2", "onnxruntime")
    runner = GenerationRunner(model)

    class CancelledAfterTwoSteps:
        reads = 0

        @property
        def cancelled(self) -> bool:
            self.reads += 1
            return self.reads > 2

    request = Request(CancelledAfterTwoSteps(), prompt=[5, 6, 7], params=Params(max_new_tokens=30, num_beams=3))
    request.options = runner.options(request.prompt, request.params)
    assert runner.run_whole(request) is None and request.ticket.reads == 3


def test_logprobs_are_the_models_own_for_each_token(worker_for):
    worker = worker_for("gpt2")

    async def go():
        ticket = worker.submit_generate([5, 6, 7], Params(max_new_tokens=4, logprobs=3))
        return [event async for event in ticket.events()]

    got = [(t, lp) for event in asyncio.run(go()) for t, lp in zip(event.tokens, event.logprobs or [])]
    tokens = [t for t, _ in got]
    logits = worker.model(input_ids=torch.tensor([[5, 6, 7, *tokens]])).logits[0, 2:]
    for i, (token, entry) in enumerate(got):
        expected = torch.log_softmax(logits[i].float(), dim=-1)
        assert entry.top[0][0] == token and len(entry.top) == 3  # greedy: the most likely one
        assert entry.logprob == pytest.approx(expected[token].item(), abs=1e-4)
