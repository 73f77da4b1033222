"""The door: API key, body size, CORS and /docs, checked before any body is parsed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hotrod.errors import HotrodError
from hotrod.serve.app import create_app
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
