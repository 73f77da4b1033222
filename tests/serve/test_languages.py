"""A request's target language: forced_bos_token_id, target_language and no_repeat_ngram_size on every
generation route, each refusal a 4xx naming its field (against a fake worker), and, in the real worker's
continuous batch, each row forced to its own language, as its request alone would be."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from fastapi.testclient import TestClient

import hotrod
from hotrod.serve.app import create_app
from hotrod.serve.messages import Params
from hotrod.serve.worker import ModelWorker, ServeOptions
from tests.pipelines.test_languages import m2m100_like, mbart50
from tests.serve.fake import FakeWorker
from tests.serve.test_worker import _alone

GENERATE = {"model": "mt", "token_ids": [5, 9, 12], "max_new_tokens": 3}


@pytest.fixture
def mt(started):
    return started(FakeWorker(name="mt", kind="seq2seq", tokenizer=mbart50()))


@pytest.fixture
def client(mt, bert):
    with TestClient(create_app({"mt": mt, "bert": bert})) as client:
        yield client


def _v2(parameters: dict) -> dict:
    return {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [[5, 9, 12]]}],
            "parameters": {"max_new_tokens": 3, **parameters}}


def _sent(mt: FakeWorker) -> list[tuple[int | None, int | None]]:
    return [(p.forced_bos_token_id, p.no_repeat_ngram_size) for _, p in mt.submitted]


def test_every_generation_route_hands_the_fields_to_the_worker(client, mt):
    for body in ({"target_language": "de_DE", "no_repeat_ngram_size": 3}, {"forced_bos_token_id": 7},
                 {"target_language": "de_DE", "forced_bos_token_id": 7}, {}):
        assert client.post("/v1/generate", json={**GENERATE, **body}).status_code == 200
    completion = {"model": "mt", "prompt": [5, 9], "max_tokens": 2, "n": 2, "target_language": "fr_XX"}
    assert client.post("/v1/completions", json=completion).status_code == 200
    assert client.post("/v2/models/mt/infer", json=_v2({"target_language": "fr_XX",
                                                        "no_repeat_ngram_size": 0})).status_code == 200
    assert _sent(mt) == [(7, 3), (7, None), (7, None), (None, None), (12, None), (12, None), (12, 0)]


@pytest.mark.parametrize("body, status, param, message", [
    ({"forced_bos_token_id": 100}, 400, "forced_bos_token_id",
     r"forced_bos_token_id: token id 100 is outside the vocabulary \[0, 100\)"),
    ({"forced_bos_token_id": -1}, 400, "forced_bos_token_id", "token id -1 is outside the vocabulary"),
    ({"target_language": "xx_YY"}, 400, "target_language",
     r"target_language: 'xx_YY' is not a language of this model's tokenizer \(it has ar_AR, cs_CZ"),
    ({"target_language": "fr_XX", "forced_bos_token_id": 7}, 400, "target_language",
     "'fr_XX' is token 12, but forced_bos_token_id is 7; give one of the two"),
    ({"target_language": ""}, 400, "target_language", "target_language"),
    ({"target_language": "x" * 33}, 400, "target_language", "target_language"),
    ({"forced_bos_token_id": "7"}, 400, "forced_bos_token_id", "forced_bos_token_id"),
    ({"no_repeat_ngram_size": -1}, 400, "no_repeat_ngram_size", "no_repeat_ngram_size"),
    ({"no_repeat_ngram_size": 33}, 400, "no_repeat_ngram_size", "no_repeat_ngram_size"),
])
def test_refusals_name_their_field_and_submit_nothing(client, mt, body, status, param, message):
    for path, request in (("/v1/generate", {**GENERATE, **body}),
                          ("/v1/completions", {"model": "mt", "prompt": [5, 9], "max_tokens": 2, **body})):
        response = client.post(path, json=request)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert re.search(message, error["message"]), error["message"]
    response = client.post("/v2/models/mt/infer", json=_v2(body))
    assert response.status_code == 400 and f"parameters.{param}" in response.json()["error"]
    assert mt.submitted == []


def test_a_model_without_language_tokens_refuses_a_target_language(started):
    plain = started(FakeWorker(name="plain", kind="seq2seq", tokenizer=None))
    body = {**GENERATE, "model": "plain", "target_language": "fr_XX"}
    with TestClient(create_app({"plain": plain})) as client:
        error = client.post("/v1/generate", json=body).json()["error"]
        assert error["param"] == "target_language" and "this model has no tokenizer" in error["message"]
        plain.tokenizer = m2m100_like(specials=())  # "__fr__" is a word of its vocabulary, not a language
        error = client.post("/v1/generate", json=body).json()["error"]
        assert error["param"] == "target_language" and "tokenizer has no language tokens" in error["message"]
        assert plain.submitted == []
        plain.tokenizer = m2m100_like()
        assert client.post("/v1/generate", json={**body, "target_language": "fr"}).status_code == 200
    assert _sent(plain) == [(5, None)]


# -- the real worker: rows of different languages in one continuous batch --------------------------------------


def test_rows_with_different_targets_in_one_batch_each_get_their_own(zoo, started, monkeypatch):
    """Concurrent requests, each naming its language (one with no-repeat n-grams, one with none, one beam
    request), get what model.generate gives each alone, though their rows shared the batch's steps."""
    model = hotrod.load(zoo.checkpoint("mbart"), backend="torch")
    model.tokenizer = mbart50()
    worker = started(ModelWorker("mt", model, ServeOptions(max_batch_size=8, max_queue_delay_ms=2.0)))
    steps: list[set] = []
    real_step = worker.runner.step

    def step(requests):
        steps.append({r.params.forced_bos_token_id for r in requests})
        return real_step(requests)

    monkeypatch.setattr(worker.runner, "step", step)
    prompts = [[5, 9, 12, 40, 61], [33, 8, 71], [5, 9, 12, 40, 61], [44, 45, 46, 47], [17, 3, 90]]
    fields = [{"target_language": "de_DE"}, {"target_language": "fr_XX"},
              {"target_language": "fr_XX", "no_repeat_ngram_size": 2}, {}, {"forced_bos_token_id": 30, "num_beams": 2}]

    async def go():
        app = create_app({"mt": worker})
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            calls = [client.post("/v1/generate", json={"token_ids": p, "max_new_tokens": 8, **f})
                     for p, f in zip(prompts, fields)]
            return await asyncio.gather(*calls)

    answers = [r.json() for r in asyncio.run(go())]
    forced = [7, 12, 12, None, 30]
    for prompt, field, token, answer in zip(prompts, fields, forced, answers):
        params = Params(max_new_tokens=8, forced_bos_token_id=token, num_beams=field.get("num_beams", 1),
                        no_repeat_ngram_size=field.get("no_repeat_ngram_size"))
        alone = _alone(model, prompt, params, worker.runner.eos_ids)
        assert answer["token_ids"] == alone, (field, answer)
        if token is not None:
            assert alone[0] == token
    assert answers[0]["token_ids"][0] != answers[1]["token_ids"][0]
    assert answers[1]["token_ids"] != answers[2]["token_ids"]  # the same prompt: no-repeat n-grams changed it
    assert any(len(languages) >= 3 for languages in steps), steps  # de_DE, fr_XX and none shared steps
