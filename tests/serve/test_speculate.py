"""Speculative decoding in the server: prompt-lookup drafts verified in the continuous batch's own step.

A greedy request's tokens must be plain greedy decoding's whether it speculates or not, alone or beside
others (the batch-invariance property of tests/serve/test_batch_invariance.py); a seeded sample repeats.
Prompts that repeat themselves make the tiny random models loop, so drafts are accepted.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
import torch
from fastapi.testclient import TestClient

from hotrod.errors import HotrodError
from hotrod.generation.lookup import Drafter, find_draft
from hotrod.serve.app import create_app
from hotrod.serve.limits import ServeLimits
from hotrod.serve.messages import Params
from hotrod.serve.runner import GenerationRunner
from hotrod.serve.scheduler import ContinuousScheduler, Request
from hotrod.serve.worker import ModelWorker, ServeOptions
from tests.serve.fake import FakeWorker
from tests.serve.test_runner import run_arriving
from tests.test_cli import assert_one_error_line, run

OPTIONS = ServeOptions(max_batch_size=8, max_queue_delay_ms=2.0, max_queue=64, prompt_lookup=5)


def _prompts(vocab: int, seed: int = 5) -> list[list[int]]:
    """Two prompts that repeat themselves, then two that do not."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.randint(2, vocab, (8,), generator=generator).tolist()
    plain = [torch.randint(2, vocab, (n,), generator=generator).tolist() for n in (11, 5)]
    return [base + base[:4] + base, base[:3] * 4, *plain]


def _greedy(model, prompt: list[int], new: int, eos: tuple[int, ...]) -> list[int]:
    """Plain greedy decoding's new tokens, up to the first EOS (what the server sends)."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new)[0]
    tokens = model.spec.generated(out, len(prompt)).tolist()
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos), tokens)


async def _collect(ticket):
    tokens, logprobs, events = [], [], 0
    async for event in ticket.events():
        assert event.error is None, event.error
        events += 1
        tokens += event.tokens
        logprobs += event.logprobs or []
        if event.finish_reason:
            return tokens, logprobs, events


async def _serve_all(worker, requests, spacing: float = 0.003):
    async def one(i, prompt, params):
        await asyncio.sleep(i * spacing)
        return await _collect(worker.submit_generate(prompt, params))

    return await asyncio.gather(*(one(i, prompt, params) for i, (prompt, params) in enumerate(requests)))


def _counted(worker, name: str) -> float:
    return sum(s.value for s in getattr(worker.metrics, name).collect()[0].samples if s.name.endswith("_total"))


@pytest.fixture
def worker_for(zoo, started):
    def make(name: str, backend: str, options: ServeOptions = OPTIONS) -> ModelWorker:
        return started(ModelWorker(name, zoo.model(name, backend), options))

    return make


# -- drafts ------------------------------------------------------------------------------------------------

def test_a_requests_drafts_are_find_drafts():
    """The incremental n-gram index drafts what `find_draft`'s scan of the whole row drafts."""
    rng = random.Random(0)
    for _ in range(400):
        row = [rng.randrange(6) for _ in range(rng.randint(1, 12))]
        drafter = Drafter(rng.randint(1, 6), prompt=rng.choice([0, len(row)]))
        for _ in range(40):
            room = rng.randint(-1, 7)
            expected = find_draft(row, min(drafter.tokens, room), drafter.prompt) if room > 0 else []
            assert drafter.draft(row, room) == expected, row
            row = row + [rng.randrange(6) for _ in range(rng.choice([1, 1, 2, 3, 8]))]  # a pass's kept draft


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_served_request_looks_single_tokens_up_in_its_whole_prompt(zoo, name):
    """The row a request drafts from begins with its prompt (an encoder-decoder's source too, which its
    decoder never holds): a single token is looked up there, as generate() does."""
    runner = GenerationRunner(zoo.model(name, "onnxruntime"), prompt_lookup=4)
    prompt = [10, 11, 12, 13, 14]
    drafter = runner.options(prompt, Params(max_new_tokens=8)).drafter
    assert drafter.prompt == len(prompt)
    assert drafter.draft([*prompt, 20, 12], 8) == [13, 14, 20, 12]


def test_drafts_rejected_in_a_row_pause_drafting_longer_each_time():
    drafter, row = Drafter(4), [1, 2, 3, 1, 2]
    assert drafter.draft(row, 10) == [3, 1, 2]
    drafter.judged(0)
    assert drafter.draft(row, 10) == [3, 1, 2]  # a first rejection does not pause
    drafter.judged(0)
    assert drafter.draft(row, 10) == [] and drafter.draft(row, 10) == [3, 1, 2]  # one step paused
    drafter.judged(0)
    assert [drafter.draft(row, 10) for _ in range(3)] == [[], [], [3, 1, 2]]  # then two
    drafter.judged(2)
    assert drafter.draft(row, 10) == [3, 1, 2] and drafter.backoff == 1  # a kept token resets it


# -- the runner --------------------------------------------------------------------------------------------

class _Ticket:
    cancelled = False


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_verifying_steps_leave_every_slot_at_its_length(zoo, name):
    """Rows join and leave while others speculate: after every step each row's cache holds its text but
    the newest token, a free slot is empty, and every row's tokens are plain greedy decoding's."""
    model = zoo.model(name, "torch")
    runner = GenerationRunner(model, prompt_lookup=4)
    scheduler = ContinuousScheduler(4, 10**6, 100, runner.eos_ids)
    prompts = _prompts(model.dims.vocab_size) * 2
    settings = [Params(max_new_tokens=n, prompt_lookup=k) for n, k in zip((14, 9, 12, 6, 3, 10, 7, 11),
                                                                             (None, 2, None, 0, None, 6, None, 1))]
    requests = [Request(_Ticket(), prompt=p, params=s) for p, s in zip(prompts, settings)]

    def cache_holds_each_rows_history():
        for group in runner.groups:
            lengths = group.state.kv.lengths.tolist()
            for slot, row in enumerate(group.rows):
                if row is not None and row.finish_reason is not None:
                    continue  # it may have verified tokens past its end; it leaves at the next plan
                held = 0 if row is None else len(model.spec.history(row.prompt, row.tokens, runner.start_token)) - 1
                assert lengths[slot] == held

    run_arriving(scheduler, runner, requests, cache_holds_each_rows_history)  # _execute: no step grew the cache
    for request in requests:
        assert request.tokens == _greedy(model, request.prompt, request.params.max_new_tokens, runner.eos_ids)
    assert runner.accepted > 0  # counted until a worker reads them


# -- the worker --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_greedy_tokens_are_plain_greedys_alone_and_beside_others(worker_for, name, runtime):
    """On torch every row speculates in the batch's pass; on onnxruntime a request speculates while it
    runs alone. Either way a request's tokens are what plain greedy decoding gives it."""
    worker = worker_for(name, runtime)
    prompts = _prompts(worker.info.vocab_size)
    target, others = prompts[0], prompts[1:] * 2
    plain = _greedy(worker.model, target, 24, worker.runner.eos_ids)
    alone = asyncio.run(_serve_all(worker, [(target, Params(max_new_tokens=24))]))[0][0]
    assert alone == plain and _counted(worker, "accepted") > 0
    mixed = [Params(max_new_tokens=n, prompt_lookup=k) for n, k in zip((17, 9, 20, 5, 13, 24), (None, 3, 0, 1, 8, 2))]
    half = len(others) // 2
    requests = [*zip(others[:half], mixed), (target, Params(max_new_tokens=24)), *zip(others[half:], mixed[half:])]
    results = asyncio.run(_serve_all(worker, requests))
    for (prompt, params), (tokens, _, _) in zip(requests, results):
        assert tokens == _greedy(worker.model, prompt, params.max_new_tokens, worker.runner.eos_ids)


def test_a_request_ends_at_its_last_token_within_a_kept_draft(worker_for):
    worker = worker_for("gpt2", "torch")
    prompt = _prompts(worker.info.vocab_size)[0]
    for new in (1, 2, 3, 7):
        tokens, _, events = asyncio.run(_serve_all(worker, [(prompt, Params(max_new_tokens=new))]))[0]
        assert tokens == _greedy(worker.model, prompt, new, worker.runner.eos_ids)
        assert events == len(tokens)  # one event per token, as plain steps send them


def test_logprobs_come_with_every_token(worker_for):
    worker = worker_for("gpt2", "torch")
    prompt = _prompts(worker.info.vocab_size)[0]
    tokens, logprobs, _ = asyncio.run(_serve_all(worker, [(prompt, Params(max_new_tokens=16, logprobs=2))]))[0]
    plain, plain_logprobs, _ = asyncio.run(_serve_all(worker, [(prompt, Params(max_new_tokens=16, logprobs=2,
                                                                                  prompt_lookup=0))]))[0]
    assert tokens == plain and len(logprobs) == len(tokens) and _counted(worker, "accepted") > 0
    for mine, theirs in zip(logprobs, plain_logprobs):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-4)
        assert [t for t, _ in mine.top] == [t for t, _ in theirs.top]


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_seeded_sample_repeats_and_is_plain_samplings(worker_for, name):
    """One draw per token, each from the distribution plain sampling draws from: the same tokens."""
    worker = worker_for(name, "torch")
    prompts = _prompts(worker.info.vocab_size)
    sampled = [Params(max_new_tokens=20, do_sample=True, temperature=0.7, top_k=20, seed=s) for s in (3, 4)]
    requests = [(prompts[0], sampled[0]), (prompts[1], sampled[1]), (prompts[2], Params(max_new_tokens=20))]
    first = asyncio.run(_serve_all(worker, requests))
    again = asyncio.run(_serve_all(worker, requests))
    assert [r[0] for r in first] == [r[0] for r in again]
    off = [(prompt, replace(params, prompt_lookup=0)) for prompt, params in requests]
    assert [r[0] for r in asyncio.run(_serve_all(worker, off))] == [r[0] for r in first]


def test_a_request_turns_the_servers_default_off(worker_for):
    worker = worker_for("gpt2", "torch")
    prompt = _prompts(worker.info.vocab_size)[0]
    asyncio.run(_serve_all(worker, [(prompt, Params(max_new_tokens=16, prompt_lookup=0))]))
    assert _counted(worker, "drafted") == 0
    asyncio.run(_serve_all(worker, [(prompt, Params(max_new_tokens=16))]))
    assert _counted(worker, "accepted") > 0


def test_beams_ignore_the_default_and_refuse_their_own(worker_for):
    worker = worker_for("gpt2", "torch")
    tokens = asyncio.run(_serve_all(worker, [([5, 6, 5, 6], Params(max_new_tokens=4, num_beams=2))]))[0][0]
    assert len(tokens) <= 4

    async def own():
        worker.submit_generate([5, 6], Params(max_new_tokens=4, num_beams=2, prompt_lookup=3))

    with pytest.raises(HotrodError, match="speculate: .*not beam search"):
        asyncio.run(own())


def test_a_model_that_cannot_verify_refuses_the_default_at_startup(zoo):
    model = zoo.model("gpt2", "static")
    assert not ModelWorker("gpt2", model, ServeOptions()).info.verifies_drafts
    with pytest.raises(HotrodError, match="model 'gpt2' cannot speculate .*static engine"):
        ModelWorker("gpt2", model, ServeOptions(prompt_lookup=4))
    with pytest.raises(HotrodError, match="prompt_lookup must be a whole number from 0 to 64"):
        ServeOptions(prompt_lookup=65)


# -- HTTP --------------------------------------------------------------------------------------------------

LIMITS = ServeLimits(max_new_tokens_limit=40, request_timeout_s=5.0)


@pytest.fixture
def client(started):
    workers = {"gpt": started(FakeWorker(name="gpt")), "static": started(FakeWorker(name="static",
                                                                                    verifies_drafts=False))}
    with TestClient(create_app(workers, LIMITS)) as client:
        yield client, workers


@pytest.mark.parametrize("path, body", [
    ("/v1/generate", {"model": "gpt", "token_ids": [1, 2], "speculate": {"prompt_lookup": 3}}),
    ("/v1/completions", {"model": "gpt", "prompt": [1, 2], "speculate": {"prompt_lookup": 3}}),
    ("/v2/models/gpt/infer", {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2],
                                          "data": [1, 2]}], "parameters": {"speculate": {"prompt_lookup": 3}}}),
])
def test_each_generating_route_takes_speculate(client, path, body):
    client, workers = client
    assert client.post(path, json=body).status_code == 200
    assert workers["gpt"].submitted[-1][1].prompt_lookup == 3
    assert client.post(path, json=_without_speculate(body)).status_code == 200
    assert workers["gpt"].submitted[-1][1].prompt_lookup is None  # the server's default


def _without_speculate(body: dict) -> dict:
    body = {key: value for key, value in body.items() if key != "speculate"}
    if "parameters" in body:
        body["parameters"] = {}
    return body


@pytest.mark.parametrize("path, body, status, message", [
    ("/v1/generate", {"num_beams": 2, "speculate": {"prompt_lookup": 3}}, 400, "speculate: prompt lookup runs"),
    ("/v1/generate", {"speculate": {"prompt_lookup": 3, "draft_model": "x"}}, 400, "speculate.draft_model: unknown field"),
    ("/v1/generate", {"speculate": {"prompt_lookup": 65}}, 400, "speculate.prompt_lookup: Input should be less than or equal"),
    ("/v1/generate", {"speculate": {"prompt_lookup": -1}}, 400, "speculate.prompt_lookup: Input should be greater than"),
    ("/v1/generate", {"speculate": {"prompt_lookup": "4"}}, 400, "speculate.prompt_lookup: Input should be a valid integer"),
    ("/v1/generate", {"speculate": {}}, 400, "speculate.prompt_lookup: Field required"),
    ("/v1/generate", {"speculate": 4}, 400, "speculate: Input should be"),
    ("/v1/generate", {"model": "static", "speculate": {"prompt_lookup": 3}}, 400, "speculate: model 'static' cannot"),
    ("/v1/completions", {"model": "static", "speculate": {"prompt_lookup": 2}}, 400, "speculate: model 'static'"),
    ("/v1/completions", {"speculate": {"prompt_lookup": 2, "ngram": 2}}, 400, "speculate.ngram: unknown field"),
])
def test_bad_speculation_is_refused_naming_the_field(client, path, body, status, message):
    client, workers = client
    prompt = {"token_ids": [1, 2]} if path == "/v1/generate" else {"prompt": [1, 2]}
    response = client.post(path, json={"model": "gpt", **prompt, **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == "speculate" and message in error["message"], error
    assert not workers["gpt"].submitted and not workers["static"].submitted
    off = {**body, "speculate": {"prompt_lookup": 0}}  # off is always allowed
    if status == 400:
        assert client.post(path, json={"model": "gpt", **prompt, **off}).status_code == 200


@pytest.mark.parametrize("model, parameters, message", [
    ("gpt", {"num_beams": 2, "speculate": {"prompt_lookup": 3}}, "parameters.speculate: prompt lookup runs"),
    ("gpt", {"speculate": {"prompt_lookup": 3, "x": 1}}, "parameters.speculate.x: unknown field"),
    ("static", {"speculate": {"prompt_lookup": 3}}, "parameters.speculate: model 'static' cannot"),
])
def test_v2_refuses_bad_speculation(client, model, parameters, message):
    client, _ = client
    body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}],
            "parameters": parameters}
    response = client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 400 and message in response.json()["error"], response.text


# -- the command line --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, message", [
    ("ngram:3", "--speculate: unknown method 'ngram'; choose from prompt-lookup"),
    ("prompt-lookup", "--speculate: prompt-lookup takes a token count from 0 to 64, as prompt-lookup:4"),
    ("prompt-lookup:x", "takes a token count"),
    ("prompt-lookup:-2", "takes a token count"),
    ("prompt-lookup:65", "takes a token count from 0 to 64, as prompt-lookup:4; got 'prompt-lookup:65'"),
])
def test_serve_refuses_a_bad_speculate_option_before_loading(zoo, capsys, value, message):
    code, out, err = run(capsys, "serve", str(zoo.artifact("gpt2")), "--speculate", value)
    assert_one_error_line(code, out, err, 1, message)
