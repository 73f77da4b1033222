"""/v1/embeddings as the official `openai` client calls it: its default asks for base64 (little-endian
float32), `dimensions` cuts each vector and makes it unit length again; both give the model's own vectors."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from hotrod.serve.app import create_app
from hotrod.serve.worker import ModelWorker, ServeOptions

openai = pytest.importorskip("openai")

TEXTS = ["the quick brown fox", "hello world this is a tiny model"]


@pytest.fixture
def served(zoo):
    model = zoo.model("bert", "onnxruntime")
    worker = ModelWorker("bert", model, ServeOptions(max_batch_size=8, max_queue_delay_ms=1.0))
    worker.start()
    try:
        with TestClient(create_app({"bert": worker})) as client:
            yield model, openai.OpenAI(api_key="unused", base_url="http://testserver/v1", http_client=client)
    finally:
        worker.stop(drain=False)


def test_the_clients_default_call_gets_the_models_vectors(served):
    model, client = served
    answer = client.embeddings.create(model="bert", input=TEXTS)  # the client asks for base64
    expected = model.embed(TEXTS, pooling="mean", normalize=True)
    got = torch.tensor([item.embedding for item in answer.data])
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-6)
    assert answer.usage.prompt_tokens > 0 and answer.model == "bert"


def test_dimensions_cut_each_vector_to_unit_length(served):
    model, client = served
    answer = client.embeddings.create(model="bert", input=TEXTS, dimensions=4, user="someone")
    full = model.embed(TEXTS, pooling="mean", normalize=True)[:, :4]
    expected = torch.nn.functional.normalize(full, dim=-1)
    got = torch.tensor([item.embedding for item in answer.data])
    assert torch.allclose(got, expected, atol=1e-6)
    floats = client.embeddings.create(model="bert", input=TEXTS[0], dimensions=4, encoding_format="float")
    assert np.allclose(floats.data[0].embedding, expected[0].numpy(), atol=1e-6)


def test_base64_is_little_endian_float32(served):
    model, client = served
    raw = client._client.post("/v1/embeddings", json={"model": "bert", "input": "hello world",
                                                      "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, model.embed(["hello world"], pooling="mean", normalize=True)[0].numpy(), atol=1e-6)


def test_too_many_dimensions_is_a_400_naming_the_field(served):
    _, client = served
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="bert", input="hello", dimensions=33)


def test_the_user_is_written_to_the_servers_console_log(served, capsys, monkeypatch):
    """`hotrod serve` puts hotrod's log lines beside uvicorn's, at its level, where nothing would write them
    (the `user` of an embeddings request was written nowhere); a process whose logging is configured keeps it."""
    import logging

    from hotrod.serve import app

    logger, root = logging.getLogger("hotrod.serve"), logging.getLogger()
    monkeypatch.setattr(logger, "handlers", [])  # as in a fresh process: no handler anywhere (pytest's taken off)
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(logger, "level", logger.level)
    app._log_beside_uvicorn("info")
    served[1].embeddings.create(model="bert", input="hello", user="alice-42")
    assert "embeddings for user 'alice-42' on model bert" in capsys.readouterr().err
    app._log_beside_uvicorn("info")  # a handler already there: one line, not two
    served[1].embeddings.create(model="bert", input="hello", user="bob")
    assert capsys.readouterr().err.count("'bob'") == 1

    class Kept(logging.Handler):
        lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(root, "handlers", [Kept()])  # the caller's own logging (basicConfig, say)
    app._log_beside_uvicorn("critical")
    assert not logger.handlers
    logger.error("to the caller's handler")
    assert Kept.lines == ["to the caller's handler"]


def test_nullable_fields_as_null_are_left_out(served):
    model, client = served
    raw = client._client.post("/v1/embeddings", json={"model": "bert", "input": "hello world",
                                                      "encoding_format": None, "dimensions": None, "user": None})
    assert raw.status_code == 200, raw.text
    vector = torch.tensor(raw.json()["data"][0]["embedding"])  # float, the default
    assert torch.allclose(vector, model.embed(["hello world"], pooling="mean", normalize=True)[0], atol=1e-6)
