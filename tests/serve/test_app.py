"""The HTTP layer against a fake worker: shapes, streaming, every refusal, overload, failures, cancellation."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST

from hotrod.errors import HotrodError
from hotrod.serve.app import StartupFailed, _Server, create_app, serve
from hotrod.serve.limits import ServeLimits
from hotrod.serve.sse import Detokenizer
from tests.serve.fake import FakeWorker, expected_embedding, expected_tokens
from tests.serve.live import free_port, live_server

LIMITS = ServeLimits(max_new_tokens_limit=40, request_timeout_s=5.0)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def client(gpt, bert):
    with TestClient(create_app({"gpt": gpt, "bert": bert}, LIMITS)) as client:
        yield client


def events(response: httpx.Response) -> list:
    """The `data:` payloads of an SSE body, JSON-decoded except the final [DONE]."""
    lines = [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", response.text
    return [json.loads(line) for line in lines[:-1]]


def wait_for(condition, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


# -- happy paths ----------------------------------------------------------------------------------------

def test_generate_from_text_and_from_token_ids(client, gpt):
    prompt = gpt.encode("hello")
    answer = client.post("/v1/generate", json={"model": "gpt", "text": "hello", "max_new_tokens": 5}).json()
    assert answer["token_ids"] == expected_tokens(prompt, 5)
    assert answer["text"] == gpt.decode(answer["token_ids"])
    assert answer["finish_reason"] == "length" and answer["model"] == "gpt"
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    by_ids = client.post("/v1/generate", json={"model": "gpt", "token_ids": prompt, "max_new_tokens": 5}).json()
    assert by_ids["token_ids"] == answer["token_ids"]


def test_streaming_yields_the_same_tokens_and_text(client):
    body = {"model": "gpt", "text": "stream me", "max_new_tokens": 12}
    whole = client.post("/v1/generate", json=body).json()
    response = client.post("/v1/generate", json={**body, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response)
    assert [t for c in chunks for t in c["token_ids"]] == whole["token_ids"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert all(c["finish_reason"] is None for c in chunks[:-1]) and chunks[-1]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == whole["usage"]


def test_sampling_parameters_reach_the_worker(client, gpt):
    client.post("/v1/generate", json={"model": "gpt", "text": "a", "do_sample": True, "temperature": 0.5,
                                      "top_k": 7, "top_p": 0.9, "seed": 3, "num_beams": 2})
    params = gpt.submitted[-1][1]
    assert (params.do_sample, params.temperature, params.top_k, params.top_p, params.seed, params.num_beams) == \
        (True, 0.5, 7, 0.9, 3, 2)
    client.post("/v1/generate", json={"model": "gpt", "text": "a", "do_sample": True, "temperature": 0})
    assert gpt.submitted[-1][1].do_sample is False  # temperature 0 is greedy
    client.post("/v1/generate", json={"model": "gpt", "text": "a"})
    assert gpt.submitted[-1][1].max_new_tokens == 32


def test_completions_in_openai_shape(client, gpt):
    answer = client.post("/v1/completions", json={"model": "gpt", "prompt": "hi", "max_tokens": 4}).json()
    assert answer["id"].startswith("cmpl-") and answer["object"] == "text_completion"
    assert isinstance(answer["created"], int) and answer["model"] == "gpt"
    tokens = expected_tokens(gpt.encode("hi"), 4)
    assert answer["choices"] == [{"text": gpt.decode(tokens), "index": 0, "finish_reason": "length",
                                  "logprobs": None}]
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert gpt.submitted[-1][1].do_sample is False  # no temperature: greedy
    client.post("/v1/completions", json={"model": "gpt", "prompt": [1, 2], "temperature": 0.7, "top_p": 0.5})
    params = gpt.submitted[-1][1]
    assert gpt.submitted[-1][0] == [1, 2] and (params.do_sample, params.temperature, params.top_p) == (True, 0.7, 0.5)


def test_completions_stream_in_openai_chunk_shape(client, gpt):
    chunks = events(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": True,
                                                         "model": "gpt"}))
    assert len(chunks) == 4 and len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "text_completion" and c["model"] == "gpt" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == gpt.decode(expected_tokens(gpt.encode("hi"), 4))
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


def test_embed(client, bert):
    answer = client.post("/v1/embed", json={"model": "bert", "texts": ["ab", "cde"]}).json()
    assert answer["model"] == "bert" and answer["usage"]["prompt_tokens"] == 5
    expected = [expected_embedding(bert.encode(t), normalize=True) for t in ("ab", "cde")]
    assert [pytest.approx(row) for row in expected] == answer["embeddings"]
    raw = client.post("/v1/embed", json={"model": "bert", "token_ids": [[1, 2]], "pooling": "cls",
                                         "normalize": False}).json()
    assert raw["embeddings"] == [pytest.approx(expected_embedding([1, 2]))]


@pytest.mark.parametrize("value, rows", [("ab", 1), (["ab", "c"], 2), ([1, 2, 3], 1), ([[1], [2, 3], [4]], 3)])
def test_embeddings_in_openai_shape(client, value, rows):
    answer = client.post("/v1/embeddings", json={"model": "bert", "input": value}).json()
    assert answer["object"] == "list" and answer["model"] == "bert"
    assert [d["index"] for d in answer["data"]] == list(range(rows))
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 8 for d in answer["data"])
    assert set(answer["usage"]) >= {"prompt_tokens", "total_tokens"}


def test_models_health_and_metrics(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"], m["kind"]) for m in models["data"]] == \
        [("gpt", "model", "hotrod", "decoder"), ("bert", "model", "hotrod", "encoder")]
    assert client.get("/v1/models/bert").json() == models["data"][1]  # the client's models.retrieve
    missing = client.get("/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["message"].startswith("model: 'nope' is not served")
    assert client.get("/health").json() == {"status": "ok"}
    client.post("/v1/generate", json={"model": "gpt", "text": "a", "max_new_tokens": 1})
    client.post("/v1/generate", json={"model": "gpt", "text": ""})
    response = client.get("/metrics")
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    assert 'hotrod_requests_total{endpoint="generate",model="gpt",outcome="ok"} 1.0' in response.text
    assert 'hotrod_requests_total{endpoint="generate",model="gpt",outcome="invalid"} 1.0' in response.text
    assert "hotrod_request_latency_seconds_bucket" in response.text


def test_ready_only_after_start():
    worker = FakeWorker()
    with TestClient(create_app({"fake": worker})) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 503
        assert client.post("/v1/generate", json={"text": "a"}).status_code == 503
        worker.start()
        assert client.get("/ready").status_code == 200
        assert client.post("/v1/generate", json={"text": "a"}).status_code == 200  # model optional: one served
    assert worker.stopped_with == [True]  # the lifespan drained it


def test_openapi_lists_endpoints_and_fields(client):
    schema = client.get("/openapi.json").json()
    assert {"/v1/generate", "/v1/completions", "/v1/embed", "/v1/embeddings", "/v1/models", "/health", "/ready",
            "/metrics"} <= set(schema["paths"])
    components = schema["components"]["schemas"]
    generate = components["GenerateRequest"]
    assert set(generate["properties"]) == {"model", "text", "token_ids", "max_new_tokens", "do_sample",
                                           "temperature", "top_k", "top_p", "repetition_penalty", "num_beams",
                                           "seed", "speculate", "stream", "no_repeat_ngram_size",
                                           "forced_bos_token_id", "target_language"}
    assert generate["additionalProperties"] is False
    assert generate["properties"]["temperature"]["minimum"] == 0
    assert generate["properties"]["num_beams"]["maximum"] == 8
    assert components["CompletionRequest"]["required"] == ["prompt"]
    assert set(components["EmbeddingsRequest"]["properties"]) == {"model", "input", "encoding_format", "dimensions",
                                                                   "user", "prompt_name", "truncate"}
    responses = schema["paths"]["/v1/generate"]["post"]["responses"]
    assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "text/event-stream" in responses["200"]["content"]
    # an invalid field is a 400 except on TEI's routes, which answer 422 in TEI's error shape
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            errors = {status: answer["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
                      for status, answer in operation["responses"].items() if status >= "400"}
            if path in ("/embed", "/embed_all", "/embed_sparse", "/similarity", "/predict", "/rerank", "/tokenize",
                        "/decode", "/info", "/"):
                assert errors["422"] == errors["400"] == "TeiErrorBody", path
            else:
                assert "422" not in errors, path
    assert "HTTPValidationError" not in components


# -- refusals ---------------------------------------------------------------------------------------------

LONG = "x" * 60
BAD_REQUESTS = [
    ("/v1/generate", '{"text": "a",', 400, None),
    ("/v1/generate", "[1, 2]", 400, None),
    ("/v1/generate", {"model": "gpt"}, 400, "text"),
    ("/v1/generate", {"model": "gpt", "text": "a", "token_ids": [1]}, 400, "text"),
    ("/v1/generate", {"model": "gpt", "text": 5}, 400, "text"),
    ("/v1/generate", {"model": "gpt", "text": "a", "colour": "red"}, 400, "colour"),
    ("/v1/generate", {"model": "gpt", "text": "a", "temperature": -1}, 400, "temperature"),
    ("/v1/generate", {"model": "gpt", "text": "a", "top_p": 0}, 400, "top_p"),
    ("/v1/generate", {"model": "gpt", "text": "a", "top_p": 1.5}, 400, "top_p"),
    ("/v1/generate", {"model": "gpt", "text": "a", "max_new_tokens": 0}, 400, "max_new_tokens"),
    ("/v1/generate", {"model": "gpt", "text": "a", "max_new_tokens": "5"}, 400, "max_new_tokens"),
    ("/v1/generate", {"model": "gpt", "text": "a", "num_beams": 9}, 400, "num_beams"),
    ("/v1/generate", {"model": "gpt", "token_ids": [1, "2"]}, 400, "token_ids"),
    ("/v1/generate", {"model": "llama", "text": "a"}, 404, "model"),
    ("/v1/generate", {"text": "a"}, 400, "model"),  # two models served: the name is required
    ("/v1/generate", {"model": "bert", "text": "a"}, 400, "model"),
    ("/v1/generate", {"model": "gpt", "text": ""}, 400, "text"),
    ("/v1/generate", {"model": "gpt", "token_ids": []}, 400, "token_ids"),
    ("/v1/generate", {"model": "gpt", "text": LONG, "max_new_tokens": 10}, 400, "text"),
    ("/v1/generate", {"model": "gpt", "token_ids": [1] * 65, "max_new_tokens": 1}, 400, "token_ids"),
    ("/v1/generate", {"model": "gpt", "text": "a", "max_new_tokens": 41}, 400, "max_new_tokens"),
    ("/v1/generate", {"model": "gpt", "token_ids": [5, 100]}, 400, "token_ids"),
    ("/v1/generate", {"model": "gpt", "token_ids": [-1]}, 400, "token_ids"),
    ("/v1/completions", {"model": "gpt"}, 400, "prompt"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "stop": list("abcde")}, 400, "stop"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "n": 17}, 400, "n"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "echo": True, "logprobs": 1}, 400, "echo"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "best_of": 2}, 400, "best_of"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "frequency_penalty": -1}, 400, "frequency_penalty"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "logit_bias": {"5": 100}}, 400, "logit_bias"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "suffix": "end"}, 400, "suffix"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "max_tokens": 41}, 400, "max_tokens"),
    ("/v1/completions", {"model": "gpt", "prompt": LONG, "max_tokens": 10}, 400, "prompt"),
    ("/v1/completions", {"model": "gpt", "prompt": [1, "a"]}, 400, "prompt"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "temperature": 3}, 400, "temperature"),
    ("/v1/embed", {"model": "gpt", "texts": ["a"]}, 400, "model"),
    ("/v1/embed", {"model": "bert", "texts": []}, 400, "texts"),
    ("/v1/embed", {"model": "bert", "texts": ["a", ""]}, 400, "texts"),
    ("/v1/embed", {"model": "bert", "texts": ["a"], "token_ids": [[1]]}, 400, "texts"),
    ("/v1/embed", {"model": "bert", "token_ids": [[1, 200]]}, 400, "token_ids"),
    ("/v1/embed", {"model": "bert", "texts": ["a"], "pooling": "max"}, 400, "pooling"),
    ("/v1/embeddings", {"model": "bert", "input": []}, 400, "input"),
    ("/v1/embeddings", {"model": "bert", "input": "a" * 65}, 400, "input"),
    ("/v1/embeddings", {"model": "bert", "input": "a", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/embeddings", {"model": "bert", "input": "a", "dimensions": 0}, 400, "dimensions"),
    ("/v1/embeddings", {"model": "bert", "input": "a", "dimensions": 9}, 400, "dimensions"),
    ("/v1/embeddings", {"model": "bert", "input": "a", "user": "u" * 257}, 400, "user"),
    ("/v1/embeddings", {"model": "bert"}, 400, "input"),
]


@pytest.mark.parametrize("path, body, status, param", BAD_REQUESTS)
def test_bad_requests_name_the_field(client, gpt, bert, path, body, status, param):
    submitted = len(gpt.submitted) + len(bert.submitted)
    if isinstance(body, str):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] and error["message"]
    if param is not None:
        assert param in error["message"]
    assert len(gpt.submitted) + len(bert.submitted) == submitted  # refused before taking a slot


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_only_json_bodies_are_read(client, gpt, content_type):
    """A browser sends text/plain and form POSTs cross-site without a preflight: they must not run."""
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/v1/generate", content=b'{"model": "gpt", "text": "a", "max_new_tokens": 1}',
                           headers=headers)
    assert response.status_code == 415 and "application/json" in response.json()["error"]["message"]
    assert gpt.submitted == []
    charset = client.post("/v1/generate", content=b'{"model": "gpt", "text": "a", "max_new_tokens": 1}',
                          headers={"content-type": "application/json; charset=utf-8"})
    assert charset.status_code == 200


def test_unknown_routes_answer_in_the_error_shape(client):
    assert client.get("/v3/nothing").json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/generate").status_code == 405


def test_a_model_of_the_wrong_kind_is_refused_naming_the_route(gpt):
    with TestClient(create_app({"gpt": gpt})) as client:
        for path, body in (("/tokenize", {"inputs": "hi"}), ("/decode", {"ids": [1]}), ("/v1/embed", {"texts": ["hi"]})):
            response = client.post(path, json=body)
            message = response.json()["error"]
            message = message if isinstance(message, str) else message["message"]
            assert response.status_code == 400 and f"{path} needs one of kind encoder" in message, response.text


def test_shutting_down_gives_503(client, gpt):
    with gpt._lock:
        gpt._accepting = False  # the worker refuses (ShuttingDown) though it still says ready
    response = client.post("/v1/generate", json={"model": "gpt", "text": "a"})
    assert response.status_code == 503 and "shutting down" in response.json()["error"]["message"]
    client.app.state.shutting_down = True
    assert client.post("/v1/embed", json={"model": "bert", "texts": ["a"]}).status_code == 503
    assert client.get("/ready").status_code == 503 and client.get("/health").status_code == 200


def test_handle_exit_flags_the_app_before_uvicorn_stops():
    app = create_app({"fake": FakeWorker()})
    server = _Server(uvicorn.Config(app), app)
    server.handle_exit(signal.SIGTERM, None)
    assert app.state.shutting_down and server.should_exit


# -- failures, overload, timeouts ------------------------------------------------------------------------

def test_a_failed_batch_is_a_500_naming_the_request_not_the_exception(client, gpt, caplog):
    for stream in (False, True):
        response = client.post("/v1/generate", json={"model": "gpt", "text": "aBc", "stream": stream})
        assert response.status_code == 500
        message = response.json()["error"]["message"]
        assert "injected fault" not in response.text and "Traceback" not in response.text
        assert response.headers["x-request-id"] in message
        assert any(response.headers["x-request-id"] in r.getMessage() and "injected fault" in r.getMessage()
                   for r in caplog.records)  # the log has the detail, under the same id
    assert client.post("/v1/generate", json={"model": "gpt", "text": "abc"}).status_code == 200
    assert 'outcome="failed"} 2.0' in client.get("/metrics").text


def test_a_failure_mid_stream_ends_the_stream_with_an_error_event(client, gpt):
    gpt.fail_after = 3
    chunks = events(client.post("/v1/generate", json={"model": "gpt", "text": "aBc", "stream": True}))
    assert len(chunks) == 4 and [len(c["token_ids"]) for c in chunks[:3]] == [1, 1, 1]
    assert chunks[-1]["error"]["type"] == "server_error"


@pytest.mark.anyio
async def test_overload_is_429_with_retry_after_and_nothing_hangs():
    worker = FakeWorker(delay=0.01, max_pending=4)
    worker.start()
    app = create_app({"fake": worker}, LIMITS)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            body = {"text": "load", "max_new_tokens": 5}
            calls = [client.post("/v1/generate", json=body) for _ in range(24)]
            responses = await asyncio.wait_for(asyncio.gather(*calls), timeout=10)
            statuses = [r.status_code for r in responses]
            assert set(statuses) == {200, 429} and statuses.count(200) >= 4
            for response in responses:
                if response.status_code == 429:
                    assert int(response.headers["retry-after"]) >= 1
                    assert response.json()["error"]["type"] == "rate_limit_error"
                else:
                    assert response.json()["token_ids"] == expected_tokens(worker.encode("load"), 5)
            assert (await client.post("/v1/generate", json=body)).status_code == 200
            metrics = (await client.get("/metrics")).text
        assert f'outcome="rejected"}} {float(statuses.count(429))}' in metrics
        assert worker.queue_depth() == 0
    finally:
        worker.stop(drain=False)


@pytest.mark.parametrize("stream", [False, True])
def test_timeout_is_504_and_cancels_the_ticket(stream):
    worker = FakeWorker(delay=0.15)
    worker.start()
    with TestClient(create_app({"fake": worker}, ServeLimits(request_timeout_s=0.5))) as client:
        response = client.post("/v1/generate", json={"text": "slow", "max_new_tokens": 20, "stream": stream})
        if stream:  # the first token came in time: the stream ends with a timeout event
            assert response.status_code == 200 and events(response)[-1]["error"]["type"] == "timeout_error"
        else:
            assert response.status_code == 504 and response.json()["error"]["type"] == "timeout_error"
        assert worker.tickets[-1].cancelled
        assert wait_for(lambda: worker.tickets[-1] in worker.cancelled)
        assert 'outcome="timeout"} 1.0' in client.get("/metrics").text
    worker.stop(drain=False)


# -- clients that go away ---------------------------------------------------------------------------------

async def _call(app, path: str, body: dict, spec: str, leave_after_chunks: int | None = None,
                leave_after_s: float | None = None) -> list[dict]:
    """Drive the app as a server would, with a client that disconnects part way."""
    gone = asyncio.Event()
    sent: list[dict] = []
    request = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict:
        if request:
            return request.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
        if leave_after_chunks is not None and len(chunks) >= leave_after_chunks:
            gone.set()

    if leave_after_s is not None:
        asyncio.get_running_loop().call_later(leave_after_s, gone.set)
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json")], "client": ("test", 1),
             "server": ("test", 80), "state": {}}
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent


@pytest.mark.anyio
@pytest.mark.parametrize("spec", ["2.3", "2.4"])
async def test_a_disconnected_stream_cancels_its_ticket(spec):
    worker = FakeWorker(delay=0.02)
    worker.start()
    app = create_app({"fake": worker})
    try:
        body = {"text": "bye", "max_new_tokens": 40, "stream": True}
        sent = await _call(app, "/v1/generate", body, spec, leave_after_chunks=2)
        assert sent[0]["status"] == 200
        ticket = worker.tickets[-1]
        assert ticket.cancelled
        await asyncio.to_thread(wait_for, lambda: ticket in worker.cancelled)
        assert 'outcome="cancelled"} 1.0' in app.state.metrics.render().decode()
    finally:
        worker.stop(drain=False)


@pytest.mark.anyio
async def test_a_disconnected_request_cancels_its_ticket():
    worker = FakeWorker(delay=0.02)
    worker.start()
    app = create_app({"fake": worker})
    try:
        await _call(app, "/v1/generate", {"text": "bye", "max_new_tokens": 40}, "2.3", leave_after_s=0.1)
        ticket = worker.tickets[-1]
        assert ticket.cancelled
        await asyncio.to_thread(wait_for, lambda: ticket in worker.cancelled)
        assert 'outcome="cancelled"} 1.0' in app.state.metrics.render().decode()
    finally:
        worker.stop(drain=False)


def test_detokenizer_holds_back_split_characters_and_keeps_spaces():
    def utf8(ids: list[int]) -> str:  # byte-level: one id per byte
        return bytes(ids).decode("utf-8", errors="replace")

    detokenizer, ids = Detokenizer(utf8), list("né ✓".encode())
    pieces = [detokenizer.add([i]) for i in ids] + [detokenizer.flush()]
    assert "".join(pieces) == "né ✓" and "\ufffd" not in "".join(pieces)

    words = ["▁Hello", "▁world", "!"]

    def sentencepiece(ids: list[int]) -> str:  # drops the leading space of what it decodes
        return "".join(words[i] for i in ids).replace("▁", " ").lstrip()

    detokenizer = Detokenizer(sentencepiece)
    assert "".join(detokenizer.add([i]) for i in range(3)) == "Hello world!"


# -- a real server ------------------------------------------------------------------------------------------

def test_over_real_http_a_closed_stream_cancels_its_ticket():
    worker = FakeWorker(delay=0.02)
    worker.start()
    try:
        with live_server(create_app({"fake": worker})) as url, httpx.Client(base_url=url, timeout=5) as client:
            body = {"text": "net", "max_new_tokens": 40, "stream": True}
            with client.stream("POST", "/v1/generate", json=body) as response:
                first = next(response.iter_lines())
                assert first.startswith("data: ")
            assert wait_for(lambda: worker.tickets and worker.tickets[-1] in worker.cancelled)
    finally:
        worker.stop(drain=False)


def test_a_model_that_fails_to_start_stops_the_server():
    class Broken(FakeWorker):
        def start(self) -> None:
            raise HotrodError("no weights in /nowhere")

    healthy, broken = FakeWorker(name="ok"), Broken(name="broken")
    with pytest.raises(StartupFailed, match="broken failed to start: no weights"):
        serve({"ok": healthy, "broken": broken}, port=free_port(), log_level="critical")
    assert healthy.stopped_with == [True] and broken.stopped_with == [True]


_SERVER = """
import sys
from hotrod.serve.app import serve
from tests.serve.fake import FakeWorker
serve({"fake": FakeWorker(delay=0.03)}, port=int(sys.argv[1]), log_level="warning")
"""


def test_sigterm_lets_open_streams_finish_then_exits():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)], cwd=ROOT, stderr=subprocess.PIPE)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            def ready() -> bool:
                try:
                    return client.get("/ready").status_code == 200
                except httpx.TransportError:
                    return False

            assert wait_for(ready, timeout=30), "the server did not become ready"
            with client.stream("POST", "/v1/generate", json={"text": "x", "max_new_tokens": 30, "stream": True}) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                process.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]" and len(rest) == 30  # 29 more tokens, then [DONE]
        assert process.wait(timeout=10) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr = process.stderr.read().decode() if process.stderr else ""
    assert "Traceback" not in stderr, stderr


# -- a model that dies, and the bounds of the server itself -------------------------------------------------

def test_a_dead_worker_turns_ready_and_its_requests_to_503(client, gpt):
    gpt.died = "the worker died: RuntimeError"
    ready = client.get("/ready")
    assert ready.status_code == 503 and "gpt has failed" in ready.json()["error"]["message"]
    response = client.post("/v1/generate", json={"model": "gpt", "text": "a"})
    assert response.status_code == 503 and gpt.submitted == []
    assert client.post("/v1/embed", json={"model": "bert", "texts": ["a"]}).status_code == 200


def test_a_model_that_dies_while_serving_stops_the_server():
    class Dying(FakeWorker):
        def start(self) -> None:
            super().start()
            self.died = "the worker died: RuntimeError"

    with pytest.raises(StartupFailed, match="model fake stopped working"):
        serve({"fake": Dying()}, port=free_port(), log_level="critical")


def test_serve_bounds_connections_and_shutdown(monkeypatch):
    seen = {}

    def run(self, sockets=None):
        seen.update(limit=self.config.limit_concurrency, grace=self.config.timeout_graceful_shutdown)

    monkeypatch.setattr(_Server, "run", run)
    serve({"fake": FakeWorker()}, ServeLimits(max_connections=7, shutdown_timeout_s=3.0), port=free_port())
    assert seen == {"limit": 7, "grace": 3.0}
