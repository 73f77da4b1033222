"""A request's inputs against the server's limits: tokens, bytes and inputs, before any slot is taken."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from hotrod.serve.app import create_app
from hotrod.serve.limits import BYTES_PER_TOKEN, RELATIVE_POSITIONS_DEFAULT, ServeLimits
from tests.serve.fake import FakeWorker


class Watched(FakeWorker):
    """Records which thread tokenizes, and how much text it was given."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.encoded: list[tuple[str, int]] = []

    def encode(self, text: str) -> list[int]:
        self.encoded.append((threading.current_thread().name, len(text)))
        return super().encode(text)


@pytest.fixture
def workers():
    made = {"t5": Watched(name="t5", kind="seq2seq", max_positions=None),
            "bert": Watched(name="bert", kind="encoder", max_positions=None)}
    for worker in made.values():
        worker.start()
    yield made
    for worker in made.values():
        worker.stop(drain=False)


def _post(client, path: str, body: dict):
    response = client.post(path, json=body)
    return response.status_code, response.json()


def test_relative_position_models_get_a_default_input_limit(workers):
    limit = RELATIVE_POSITIONS_DEFAULT
    with TestClient(create_app(workers)) as client:
        status, body = _post(client, "/v1/generate", {"model": "t5", "token_ids": [1] * (limit + 1)})
        assert status == 400 and body["error"]["param"] == "token_ids" and str(limit) in body["error"]["message"]
        assert _post(client, "/v1/generate", {"model": "t5", "token_ids": [1] * limit, "max_new_tokens": 1})[0] == 200
    assert workers["t5"].submitted[-1][0] == [1] * limit and len(workers["t5"].submitted) == 1


def test_the_input_limit_can_be_set_and_applies_to_embeddings(workers):
    with TestClient(create_app(workers, ServeLimits(max_input_tokens=8))) as client:
        status, body = _post(client, "/v1/generate", {"model": "t5", "text": "123456789"})
        assert status == 400 and "at most 8 tokens" in body["error"]["message"]
        status, body = _post(client, "/v1/embeddings", {"model": "bert", "input": ["ok", "x" * 9]})
        assert status == 400 and body["error"]["message"].startswith("input[1]: 9 tokens")
    assert workers["t5"].submitted == [] and workers["bert"].submitted == []


def test_text_past_the_byte_budget_is_refused_without_tokenizing(workers):
    budget = 8 * BYTES_PER_TOKEN
    with TestClient(create_app(workers, ServeLimits(max_input_tokens=8))) as client:
        status, body = _post(client, "/v1/generate", {"model": "t5", "text": "a" * (budget + 1)})
        assert status == 400 and f"{budget} bytes" in body["error"]["message"]
        multibyte = "é" * (budget // 2 + 1)  # fewer characters than bytes
        assert _post(client, "/v1/completions", {"model": "t5", "prompt": multibyte})[0] == 400
        assert _post(client, "/v1/embed", {"model": "bert", "texts": ["a", "a" * (budget + 1)]})[0] == 400
    assert workers["t5"].encoded == [] and workers["bert"].encoded == []


def test_embedding_requests_have_a_bound_on_inputs(workers):
    with TestClient(create_app(workers, ServeLimits(max_batch_inputs=3))) as client:
        status, body = _post(client, "/v1/embeddings", {"model": "bert", "input": ["a"] * 4})
        assert status == 400 and body["error"]["param"] == "input" and "at most 3" in body["error"]["message"]
        assert _post(client, "/v1/embed", {"model": "bert", "token_ids": [[1]] * 4})[0] == 400
        assert _post(client, "/v1/embeddings", {"model": "bert", "input": ["a"] * 3})[0] == 200
    assert workers["bert"].encoded == [(workers["bert"].encoded[0][0], 1)] * 3


def test_tokenizing_runs_off_the_event_loop_on_one_thread_per_model(workers):
    with TestClient(create_app(workers)) as client:
        for text in ("one", "two"):
            assert _post(client, "/v1/generate", {"model": "t5", "text": text, "max_new_tokens": 1})[0] == 200
        assert _post(client, "/v1/embed", {"model": "bert", "texts": ["x", "y"]})[0] == 200
    assert {name for name, _ in workers["t5"].encoded} == {"hotrod-tokenize-t5_0"}
    assert {name for name, _ in workers["bert"].encoded} == {"hotrod-tokenize-bert_0"}
