"""The door: API key, body size, CORS and /docs, checked before any body is parsed."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from hotrod.errors import HotrodError
from hotrod.serve.app import create_app
from hotrod.serve.http_errors import error_body
from hotrod.serve.limits import Access, ServeLimits
from tests.serve.fake import FakeWorker

BODY = {"text": "a", "max_new_tokens": 1}


@pytest.fixture
def worker():
    worker = FakeWorker()
    worker.start()
    yield worker
    worker.stop(drain=False)


def _client(worker, limits: ServeLimits | None = None, access: Access | None = None) -> TestClient:
    return TestClient(create_app({"fake": worker}, limits, access=access))


def test_an_api_key_guards_every_v1_route_and_leaves_the_probes_open(worker):
    with _client(worker, access=Access(api_key="s3cret")) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            refused = client.post("/v1/generate", json=BODY, headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["type"] == "authentication_error"
        assert client.get("/v1/models").status_code == 401
        assert client.post("/v1/generate", content=b"{broken", headers={"content-type": "application/json"}
                           ).status_code == 401  # refused before its body is read
        assert worker.submitted == []
        assert client.post("/v1/generate", json=BODY, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert [client.get(path).status_code for path in ("/health", "/ready", "/metrics")] == [200, 200, 200]
        assert 'outcome="invalid"' in client.get("/metrics").text  # refusals are counted


def test_a_body_over_the_limit_is_413_before_it_is_parsed(worker):
    with _client(worker, ServeLimits(max_request_bytes=64)) as client:
        big = b'{"text": "' + b"a" * 100 + b'"}'
        declared = client.post("/v1/generate", content=big, headers={"content-type": "application/json"})
        assert declared.status_code == 413 and "64 bytes" in declared.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            yield big[:50]
            yield big[50:]

        streamed = client.post("/v1/generate", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        assert client.post("/v1/generate", json=BODY).status_code == 200
    assert len(worker.submitted) == 1


def test_cors_is_off_unless_origins_are_named(worker):
    origin = {"Origin": "https://app.example"}
    with _client(worker) as client:
        assert "access-control-allow-origin" not in client.post("/v1/generate", json=BODY, headers=origin).headers
    with _client(worker, access=Access(cors_origins=("https://app.example",))) as client:
        allowed = client.post("/v1/generate", json=BODY, headers=origin)
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        preflight = client.options("/v1/generate", headers={**origin, "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 200
        other = client.post("/v1/generate", json=BODY, headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_docs_are_off_by_default(worker):
    with _client(worker) as client:
        assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    with _client(worker, access=Access(docs=True)) as client:
        assert client.get("/docs").status_code == 200


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_request_bytes=0), "max_request_bytes must be an integer >= 1"),
    (dict(max_batch_inputs=0), "max_batch_inputs"),
    (dict(max_input_tokens=0), "max_input_tokens"),
    (dict(max_connections=-1), "max_connections"),
    (dict(request_timeout_s=float("inf")), "request_timeout_s must be a finite number"),
    (dict(shutdown_timeout_s=float("nan")), "shutdown_timeout_s must be a finite number"),
])
def test_limits_are_checked(kwargs, message):
    with pytest.raises(HotrodError, match=message):
        ServeLimits(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(api_key=""), dict(api_key="two words"), dict(cors_origins=("",))])
def test_access_options_are_checked(kwargs):
    with pytest.raises(HotrodError):
        Access(**kwargs)


LONE = "\ud800"  # half a surrogate pair: json.dumps writes it as the escape, valid JSON no UTF-8 encoder takes
V2 = "/v2/models/fake/infer"


def _texts(name: str, value: str) -> dict:
    return {"inputs": [{"name": name, "datatype": "BYTES", "shape": [1], "data": [value]}]}


@pytest.mark.parametrize("path, body, where", [
    ("/v1/generate", {"text": LONE}, "text"),
    ("/v1/generate", {"model": LONE, "text": "hi"}, "model"),
    ("/v1/completions", {"prompt": LONE}, "prompt"),
    ("/v1/embeddings", {"model": "bert", "input": ["ok", LONE, LONE + "x"]}, "input[1]"),  # the first named
    ("/embed", {"inputs": LONE}, "inputs"),
    ("/tokenize", {"inputs": LONE}, "inputs"),
    (V2, _texts("text_input", LONE), "inputs[0].data[0]"),
    (V2, _texts(LONE, "a"), "inputs[0].name"),
    (V2, {LONE: 1, "inputs": []}, "body (a key)"),
])
def test_a_lone_surrogate_is_a_400_at_the_door(worker, path, body, where):
    bert = FakeWorker(name="bert", kind="encoder")
    bert.start()
    try:
        with TestClient(create_app({"fake": worker, "bert": bert})) as client:
            response = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    finally:
        bert.stop(drain=False)
    assert response.status_code == 400, response.text
    assert f"{where}: the text holds a lone UTF-16 surrogate" in response.text
    assert worker.submitted == [] and bert.submitted == []


def test_a_whole_surrogate_pair_is_text_and_messages_repeating_odd_text_still_encode(worker):
    with _client(worker) as client:
        emoji = client.post("/v1/generate", content=json.dumps({"text": "\U0001F600", "max_new_tokens": 1}),
                            headers={"content-type": "application/json"})  # written as a pair of escapes
        assert emoji.status_code == 200, emoji.text
        assert worker.submitted[-1][0] == worker.encode("\U0001F600")
    assert error_body(404, "model '\ud800' is not served", "\udfff")["error"] == {
        "message": "model '\\ud800' is not served", "type": "not_found_error", "param": "\\udfff"}


def test_binary_header_lengths_and_compressed_bodies_are_4xx(worker):
    header = {"content-type": "application/octet-stream"}
    with _client(worker) as client:
        for length in ("²".encode("latin-1"), "9" * 5000, "-1", "0"):  # the raw byte 0xb2 reads as "²"
            response = client.post(V2, content=b'{"inputs": []}',
                                   headers={**header, "Inference-Header-Content-Length": length})
            assert response.status_code == 400 and "Inference-Header-Content-Length" in response.json()["error"]
        head = json.dumps(_texts(LONE, "a"))
        response = client.post(V2, content=head,
                               headers={**header, "Inference-Header-Content-Length": str(len(head))})
        assert response.status_code == 400 and "lone UTF-16 surrogate" in response.json()["error"]
        anywhere = client.post("/v1/generate", content=json.dumps({"text": LONE}), headers={
            "content-type": "application/json", "Inference-Header-Content-Length": "5"})  # the header: v2's only
        assert anywhere.status_code == 400 and "lone UTF-16 surrogate" in anywhere.text
        gzipped = client.post("/v1/generate", content=b"\x1f\x8b...", headers={
            "content-type": "application/json", "content-encoding": "gzip"})
        assert gzipped.status_code == 415 and "uncompressed" in gzipped.json()["error"]["message"]
    assert worker.submitted == []
