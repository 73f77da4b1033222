"""The Open Inference Protocol (/v2) against a fake worker: every route, JSON and binary tensors, every
refusal; and end to end, Triton's own HTTP client against a real server on tiny real models."""

from __future__ import annotations

import json
import struct
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from hotrod.serve.app import create_app
from hotrod.serve.limits import Access, ServeLimits
from hotrod.serve.messages import Event
from tests.serve.fake import FAIL_TOKEN, FakeWorker, expected_embedding, expected_tokens
from tests.serve.live import live_server
from tests.serve.test_app import wait_for

LIMITS = ServeLimits(max_new_tokens_limit=40, request_timeout_s=5.0, max_batch_inputs=4)
HEADER = "Inference-Header-Content-Length"


class ShortRows(FakeWorker):
    """A prompt starting with id 1 ends after two tokens, as at an end-of-text."""

    def _step(self, job) -> bool:
        if job.params is not None and job.prompt[:1] == [1] and job.step == 2:
            job.ticket.push(Event(finish_reason="stop"))
            return True
        return super()._step(job)


@pytest.fixture
def gpt(started):
    return started(ShortRows(name="gpt"))


@pytest.fixture
def client(gpt, bert):
    with TestClient(create_app({"gpt": gpt, "bert": bert}, LIMITS)) as client:
        yield client


def text(name: str, texts: list[str], shape: list[int] | None = None) -> dict:
    return {"name": name, "datatype": "BYTES", "shape": shape or [len(texts)], "data": texts}


def ids(rows: list[list[int]], name: str = "input_ids") -> dict:
    return {"name": name, "datatype": "INT64", "shape": [len(rows), len(rows[0])], "data": rows}


def bytes_tensor(texts: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(t)) + t for t in texts)


def binary(request: dict, blobs: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """A body in the binary tensor form: each input with data=None gets the next blob."""
    blobs = iter(blobs)
    for tensor in request["inputs"]:
        if tensor.get("data") is None:
            tensor.pop("data", None)
            blob = next(blobs)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            tensor["_blob"] = blob
    raw = b"".join(t.pop("_blob", b"") for t in request["inputs"])
    head = json.dumps(request).encode()
    return head + raw, {HEADER: str(len(head))}


def outputs_of(response: httpx.Response) -> tuple[dict, dict[str, np.ndarray]]:
    """The response's JSON and each output as an array, whether sent as JSON or as binary data."""
    assert response.status_code == 200, response.text
    length = int(response.headers.get(HEADER, len(response.content)))
    head, rest = json.loads(response.content[:length]), response.content[length:]
    arrays = {}
    for out in head["outputs"]:
        size = out.get("parameters", {}).get("binary_data_size")
        if size is None:
            arrays[out["name"]] = np.array(out["data"], dtype=object if out["datatype"] == "BYTES" else None)
        else:
            blob, rest = rest[:size], rest[size:]
            arrays[out["name"]] = _decode(blob, out["datatype"])
        arrays[out["name"]] = arrays[out["name"]].reshape(out["shape"])
    assert rest == b""
    return head, arrays


def _decode(blob: bytes, datatype: str) -> np.ndarray:
    if datatype != "BYTES":
        return np.frombuffer(blob, dtype={"INT64": "<i8", "FP32": "<f4"}[datatype])
    items, offset = [], 0
    while offset < len(blob):
        (n,) = struct.unpack_from("<I", blob, offset)
        items.append(blob[offset + 4:offset + 4 + n].decode())
        offset += 4 + n
    return np.array(items, dtype=object)


# -- probes and metadata ----------------------------------------------------------------------------------

def test_health_and_server_metadata(started):
    worker = FakeWorker()
    with TestClient(create_app({"fake": worker})) as client:
        assert client.get("/v2/health/live").json() == {"live": True}
        loading = client.get("/v2/health/ready")
        assert loading.status_code == 503 and "still loading fake" in loading.json()["error"]
        started(worker)
        assert client.get("/v2/health/ready").json() == {"ready": True}
        assert client.get("/v2").json() == {"name": "hotrod", "version": "0.1.0", "extensions": ["binary_tensor_data"]}
        assert client.get("/v2/nothing").json() == {"error": "Not Found"}
        assert client.get("/v2/models/fake/infer").json() == {"error": "Method Not Allowed"}


def test_model_metadata_names_every_tensor(client):
    gpt = client.get("/v2/models/gpt").json()
    assert gpt == client.get("/v2/models/gpt/versions/1").json()
    assert (gpt["name"], gpt["versions"], gpt["platform"]) == ("gpt", ["1"], "hotrod")
    assert gpt["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [-1]},
                             {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}]
    assert [(o["name"], o["datatype"]) for o in gpt["outputs"]] == [
        ("text_output", "BYTES"), ("output_ids", "INT64"), ("output_lengths", "INT64"), ("finish_reason", "BYTES")]
    assert gpt["parameters"] == {"kind": "decoder", "max_batch_inputs": 4, "max_input_tokens": 64,
                                 "max_new_tokens_limit": 40, "output_ids_pad": -1}
    bert = client.get("/v2/models/bert").json()
    assert [i["name"] for i in bert["inputs"]] == ["text", "input_ids"]
    assert bert["outputs"] == [{"name": "embeddings", "datatype": "FP32", "shape": [-1, -1]}]
    for path in ("/v2/models/llama", "/v2/models/gpt/versions/2", "/v2/models/gpt/versions/2/ready"):
        missing = client.get(path)
        assert missing.status_code == 404 and list(missing.json()) == ["error"], path


def test_model_ready_follows_the_worker(client, gpt):
    assert client.get("/v2/models/gpt/ready").json() == {"name": "gpt", "ready": True}
    assert client.get("/v2/models/gpt/versions/1/ready").status_code == 200
    gpt.died = "the worker died"
    assert "has failed" in client.get("/v2/models/gpt/ready").json()["error"]
    assert client.get("/v2/models/bert/ready").status_code == 200
    client.app.state.shutting_down = True
    assert client.get("/v2/models/bert/ready").status_code == 503


# -- generation -------------------------------------------------------------------------------------------

def test_generate_from_texts_answers_every_output_in_order(client, gpt):
    body = {"id": "req-7", "inputs": [text("text_input", ["hello", "ab"])], "parameters": {"max_new_tokens": 3}}
    head, out = outputs_of(client.post("/v2/models/gpt/infer", json=body))
    assert (head["id"], head["model_name"], head["model_version"]) == ("req-7", "gpt", "1")
    expected = [expected_tokens(gpt.encode(t), 3) for t in ("hello", "ab")]
    assert out["output_ids"].tolist() == expected
    assert out["text_output"].tolist() == [gpt.decode(row) for row in expected]
    assert out["output_lengths"].tolist() == [3, 3] and out["finish_reason"].tolist() == ["length", "length"]
    assert [o["name"] for o in head["outputs"]] == ["text_output", "output_ids", "output_lengths", "finish_reason"]
    assert [prompt for prompt, _ in gpt.submitted] == [gpt.encode("hello"), gpt.encode("ab")]  # a request per row


@pytest.mark.parametrize("tensor", [
    ids([[5, 6], [1, 7], [8, 9]]),
    {**ids([[5, 6], [1, 7], [8, 9]]), "data": [5, 6, 1, 7, 8, 9]},  # flat data
])
def test_generate_from_ids_pads_short_rows(client, tensor):
    body = {"inputs": [tensor], "parameters": {"max_new_tokens": 4}}
    _, out = outputs_of(client.post("/v2/models/gpt/infer", json=body))
    assert out["output_ids"].tolist() == [expected_tokens([5, 6], 4), expected_tokens([1, 7], 2) + [-1, -1],
                                          expected_tokens([8, 9], 4)]
    assert out["output_lengths"].tolist() == [4, 2, 4] and out["finish_reason"].tolist() == ["length", "stop",
                                                                                             "length"]


def test_one_row_shapes(client):
    one = {"name": "input_ids", "datatype": "INT64", "shape": [3], "data": [5, 6, 7]}
    _, out = outputs_of(client.post("/v2/models/gpt/infer", json={"inputs": [one]}))
    assert out["output_ids"].shape == (1, 32)  # the default max_new_tokens, as /v1/generate's
    column = text("text_input", [["hi"], ["yo"]], shape=[2, 1])
    _, out = outputs_of(client.post("/v2/models/gpt/infer", json={"inputs": [column]}))
    assert out["output_lengths"].tolist() == [32, 32]


def test_parameters_reach_the_worker_as_from_v1_generate(client, gpt):
    parameters = {"do_sample": True, "temperature": 0.5, "top_k": 7, "top_p": 0.9, "seed": 3, "num_beams": 2,
                  "repetition_penalty": 1.2, "max_new_tokens": 2}
    client.post("/v2/models/gpt/infer", json={"inputs": [ids([[5], [6]])], "parameters": parameters})
    for _, params in gpt.submitted:  # every row the same parameters, the same seed: what /v1/generate gives it
        assert (params.do_sample, params.temperature, params.top_k, params.top_p, params.seed, params.num_beams,
                params.repetition_penalty, params.max_new_tokens) == (True, 0.5, 7, 0.9, 3, 2, 1.2, 2)
    client.post("/v2/models/gpt/infer", json={"inputs": [ids([[5]])], "parameters": {"do_sample": True,
                                                                                     "temperature": 0}})
    assert gpt.submitted[-1][1].do_sample is False


# -- embeddings, requested outputs, binary data ---------------------------------------------------------------

def test_embed_texts_and_ids(client, bert):
    head, out = outputs_of(client.post("/v2/models/bert/infer", json={"inputs": [text("text", ["ab", "cde"])]}))
    assert head["outputs"][0]["shape"] == [2, 8]
    expected = [expected_embedding(bert.encode(t), normalize=True) for t in ("ab", "cde")]
    np.testing.assert_allclose(out["embeddings"], expected, rtol=1e-6)
    body = {"inputs": [ids([[1, 2]])], "parameters": {"pooling": "cls", "normalize": False}}
    _, out = outputs_of(client.post("/v2/models/bert/infer", json=body))
    np.testing.assert_allclose(out["embeddings"], [expected_embedding([1, 2])], rtol=1e-6)


def test_only_the_requested_outputs_each_in_its_form(client, gpt):
    body = {"inputs": [ids([[5, 6]])], "parameters": {"max_new_tokens": 3},
            "outputs": [{"name": "output_lengths"}, {"name": "output_ids", "parameters": {"binary_data": True}}]}
    response = client.post("/v2/models/gpt/infer", json=body)
    assert response.headers["content-type"] == "application/octet-stream"
    head, out = outputs_of(response)
    assert [o["name"] for o in head["outputs"]] == ["output_lengths", "output_ids"]
    assert "data" in head["outputs"][0] and head["outputs"][1]["parameters"] == {"binary_data_size": 24}
    assert out["output_ids"].tolist() == [expected_tokens([5, 6], 3)]
    body = {"inputs": [ids([[5, 6]])], "parameters": {"max_new_tokens": 3, "binary_data_output": True},
            "outputs": [{"name": "text_output"}, {"name": "output_ids", "parameters": {"binary_data": False}}]}
    head, out = outputs_of(client.post("/v2/models/gpt/infer", json=body))
    assert "parameters" in head["outputs"][0] and "data" in head["outputs"][1]
    assert out["text_output"].tolist() == [gpt.decode(expected_tokens([5, 6], 3))]
    plain = client.post("/v2/models/gpt/infer", json={"inputs": [ids([[5]])]})
    assert plain.headers["content-type"] == "application/json" and HEADER.lower() not in plain.headers


def test_binary_inputs_as_tritonclient_sends_them(client, gpt, bert):
    request = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2], "data": None}],
               "parameters": {"max_new_tokens": 2, "binary_data_output": True}}
    body, headers = binary(request, [bytes_tensor(["né".encode(), b"ab"])])
    head, out = outputs_of(client.post("/v2/models/gpt/infer", content=body, headers=headers))  # no content-type
    assert out["output_ids"].tolist() == [expected_tokens(gpt.encode(t), 2) for t in ("né", "ab")]
    assert all("parameters" in o for o in head["outputs"])
    request = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 2], "data": None}]}
    body, headers = binary(request, [np.array([[1, 2], [3, 4]], dtype="<i8").tobytes()])
    _, out = outputs_of(client.post("/v2/models/bert/infer", content=body, headers=headers))
    np.testing.assert_allclose(out["embeddings"], [expected_embedding(r, normalize=True) for r in ([1, 2], [3, 4])],
                               rtol=1e-6)


# -- refusals ---------------------------------------------------------------------------------------------

IDS = {"name": "input_ids", "datatype": "INT64", "shape": [1, 2]}
REFUSED = [
    ("gpt", {"inputs": [{**IDS, "datatype": "FP32", "data": [1.0, 2.0]}]}, "datatype FP32"),
    ("gpt", {"inputs": [{**IDS, "data": [1]}]}, "1 elements for shape [1, 2]"),
    ("gpt", {"inputs": [{**IDS, "shape": [2, 2], "data": [[1, 2], [3]]}]}, "does not match shape"),
    ("gpt", {"inputs": [{**IDS, "shape": [2], "data": [[1], [2]]}]}, "nested deeper than shape [2]"),
    ("gpt", {"inputs": [{**IDS, "shape": [1, -2], "data": [1, 2]}]}, "non-negative integers"),
    ("gpt", {"inputs": [{**IDS, "shape": [1, 1, 2], "data": [1, 2]}]}, "[n, L]"),
    ("gpt", {"inputs": [{**IDS, "data": [1, "2"]}]}, "element '2' is not of datatype INT64"),
    ("gpt", {"inputs": [{**IDS, "data": [1, True]}]}, "element True is not of datatype INT64"),
    ("gpt", {"inputs": [{**IDS, "data": [1, 100]}]}, "input_ids[0]: token id 100 is outside the vocabulary"),
    ("gpt", {"inputs": [{**IDS, "shape": [1, 65], "data": [1] * 65}]}, "rows of 65 tokens"),
    ("gpt", {"inputs": [{**IDS, "shape": [0, 2], "data": []}]}, "0 rows"),
    ("gpt", {"inputs": [{**IDS, "shape": [1, 0], "data": []}]}, "input_ids[0]: the input is empty"),
    ("gpt", {"inputs": [ids([[1]] * 5)]}, "5 rows; this server takes 1 to 4"),
    ("gpt", {"inputs": [text("text_input", ["a", ""])]}, "text_input[1]: the input is empty"),
    ("gpt", {"inputs": [text("text_input", ["x" * 3000])]}, "longer than this server takes"),
    ("gpt", {"inputs": [text("text_input", ["a", "b"], shape=[1, 2])]}, "[n] or [n, 1]"),
    ("gpt", {"inputs": [ids([[1] * 60])], "parameters": {"max_new_tokens": 10}}, "exceed the model's 64 positions"),
    ("gpt", {"inputs": [ids([[1]])], "parameters": {"max_new_tokens": 41}}, "above this server's limit of 40"),
    ("gpt", {"inputs": [ids([[1]])], "parameters": {"temperature": -1}}, "parameters.temperature"),
    ("gpt", {"inputs": [ids([[1]])], "parameters": {"top_k": 1.5}}, "parameters.top_k"),
    ("gpt", {"inputs": [ids([[1]])], "parameters": {"pooling": "cls"}}, "parameters.pooling: not a parameter"),
    ("gpt", {"inputs": [ids([[1]])], "parameters": {"binary_data_output": "yes"}}, "true or false"),
    ("gpt", {"inputs": [ids([[1]])], "outputs": [{"name": "logits"}]}, "'logits' is not an output"),
    ("gpt", {"inputs": [ids([[1]])], "outputs": [{"name": "text_output"}] * 2}, "asked for twice"),
    ("gpt", {"inputs": [ids([[1]])], "outputs": [{"name": "text_output", "parameters": {"classification": 2}}]},
     "classification"),
    ("gpt", {"inputs": [ids([[1]]), text("text_input", ["a"])]}, "exactly one of text_input and input_ids"),
    ("gpt", {"inputs": [text("prompt", ["a"])]}, "prompt: not an input"),
    ("gpt", {"inputs": []}, "non-empty list"),
    ("gpt", {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1]}]}, "no data"),
    ("gpt", {"inputs": [ids([[1]])], "colour": "red"}, "colour: not a field"),
    ("gpt", {"inputs": [ids([[1]])], "id": 5}, "id: must be a string"),
    ("bert", {"inputs": [text("text_input", ["a"])]}, "not an input of model 'bert' (kind encoder)"),
    ("bert", {"inputs": [text("text", ["a"])], "parameters": {"max_new_tokens": 2}}, "max_new_tokens: not a param"),
    ("bert", {"inputs": [text("text", ["a"])], "parameters": {"pooling": "max"}}, "parameters.pooling"),
]


@pytest.mark.parametrize("model, body, message", REFUSED)
def test_bad_requests_are_400_in_the_v2_error_shape(client, gpt, bert, model, body, message):
    response = client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"] and message in response.json()["error"], response.json()
    assert gpt.submitted == [] and bert.submitted == []  # refused before taking a slot


TEXT = {"name": "text_input", "datatype": "BYTES", "shape": [1]}
BAD_BINARY = [
    ({"inputs": [{**TEXT, "parameters": {"binary_data_size": 5}}]}, b"", None, "needs the " + HEADER),
    ({"inputs": [{**TEXT, "parameters": {"binary_data_size": 5}}]}, bytes_tensor([b"a"]), "x", "not a length"),
    ({"inputs": [{**TEXT, "parameters": {"binary_data_size": 5}}]}, bytes_tensor([b"a"]), "99999", "not a length"),
    ({"inputs": [{**TEXT, "parameters": {"binary_data_size": 5}}]}, bytes_tensor([b"a"]) + b"!", "", "account for"),
    ({"inputs": [{**TEXT, "parameters": {"binary_data_size": 6}}]}, bytes_tensor([b"a"]), "", "past the end"),
    ({"inputs": [{**TEXT, "parameters": {"binary_data_size": 3}}]}, b"\x09\x00\x00", "", "not 1 BYTES elements"),
    ({"inputs": [{**TEXT, "parameters": {"binary_data_size": 6}}]}, bytes_tensor([b"\xff\xfe"]), "", "not UTF-8"),
    ({"inputs": [{**TEXT, "data": ["a"], "parameters": {"binary_data_size": 5}}]}, bytes_tensor([b"a"]), "",
     "not both"),
    ({"inputs": [{**TEXT, "parameters": {"shared_memory_region": "r"}}]}, b"", "", "only binary_data_size"),
    ({"inputs": [{**IDS, "parameters": {"binary_data_size": 12}}]}, bytes(12), "", "12 bytes of binary data"),
]


@pytest.mark.parametrize("request_, blob, header, message", BAD_BINARY)
def test_bad_binary_bodies_are_400(client, gpt, request_, blob, header, message):
    head = json.dumps(request_).encode()
    headers = {} if header is None else {HEADER: header or str(len(head))}
    response = client.post("/v2/models/gpt/infer", content=head + blob,
                           headers={**headers, "content-type": "application/json"})
    assert response.status_code == 400 and message in response.json()["error"], response.text
    assert gpt.submitted == []


def test_the_door_guards_v2_and_reads_what_tritonclient_sends(gpt):
    body = json.dumps({"inputs": [ids([[5]])], "parameters": {"max_new_tokens": 1}}).encode()
    app = create_app({"gpt": gpt}, ServeLimits(max_request_bytes=400), access=Access(api_key="k"))
    key = {"Authorization": "Bearer k"}
    with TestClient(app) as client:
        for path in ("/v2", "/v2/models/gpt", "/v2/models/gpt/ready"):
            assert client.get(path).json() == {"error": "a valid API key is required: send `Authorization: Bearer "
                                                        "<key>`"}
        refused = client.post("/v2/models/gpt/infer", content=body)
        assert refused.status_code == 401 and list(refused.json()) == ["error"]
        assert client.get("/v2/health/live").status_code == 200 and client.get("/v2/health/ready").status_code == 200
        assert client.post("/v2/models/gpt/infer", content=body, headers=key).status_code == 200  # no content-type
        for headers in ({"content-type": "text/plain"}, {"Origin": "https://evil.example"}):
            response = client.post("/v2/models/gpt/infer", content=body, headers={**key, **headers})
            assert response.status_code == 415 and "application/json" in response.json()["error"]
        assert client.post("/v1/generate", content=b'{"text": "a"}', headers=key).status_code == 415  # /v1 as ever
        binary_form = {**key, HEADER: str(len(body)), "content-type": "application/octet-stream"}
        assert client.post("/v2/models/gpt/infer", content=body, headers=binary_form).status_code == 200
        gzip = client.post("/v2/models/gpt/infer", content=body, headers={**key, "Content-Encoding": "gzip"})
        assert gzip.status_code == 415 and "compressed" in gzip.json()["error"]
        big = client.post("/v2/models/gpt/infer", content=body + b" " * 400, headers={**key, HEADER: str(len(body))})
        assert big.status_code == 413 and "400 bytes" in big.json()["error"]
        metrics = client.get("/metrics").text
    assert 'hotrod_requests_total{endpoint="infer",model="gpt",outcome="ok"} 2.0' in metrics
    assert 'hotrod_requests_total{endpoint="infer",model="gpt",outcome="invalid"} 5.0' in metrics


# -- overload, failures, timeouts -------------------------------------------------------------------------

def test_a_full_queue_is_429_and_lets_the_rows_it_took_go(started):
    worker = started(FakeWorker(max_pending=2, delay=0.05))
    with TestClient(create_app({"fake": worker}, LIMITS)) as client:
        response = client.post("/v2/models/fake/infer", json={"inputs": [ids([[5], [6], [7]])]})
        assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
        assert list(response.json()) == ["error"]
        assert len(worker.tickets) == 2 and all(t.cancelled for t in worker.tickets)
        assert wait_for(lambda: worker.queue_depth() == 0)


def test_a_failed_row_fails_the_request_and_cancels_its_other_rows(client, gpt):
    gpt.delay = 0.01
    body = {"inputs": [ids([[5, 6], [FAIL_TOKEN, 6]])], "parameters": {"max_new_tokens": 30}}
    response = client.post("/v2/models/gpt/infer", json=body)
    assert response.status_code == 500 and response.headers["x-request-id"] in response.json()["error"]
    assert "injected" not in response.text
    assert wait_for(lambda: gpt.tickets[0] in gpt.cancelled)


def test_shutting_down_and_timeouts(gpt):
    gpt.delay = 0.1
    with TestClient(create_app({"gpt": gpt}, ServeLimits(request_timeout_s=0.3))) as client:
        body = {"inputs": [ids([[5], [6]])], "parameters": {"max_new_tokens": 20}}
        response = client.post("/v2/models/gpt/infer", json=body)
        assert response.status_code == 504 and "did not finish" in response.json()["error"]
        assert all(t.cancelled for t in gpt.tickets)
        client.app.state.shutting_down = True
        assert client.post("/v2/models/gpt/infer", json=body).json() == {"error": "the server is shutting down"}
        assert 'endpoint="infer",model="gpt",outcome="timeout"} 1.0' in client.get("/metrics").text


def test_tritons_timeout_bounds_a_request_below_the_servers_and_priority_is_refused(gpt):
    gpt.delay = 0.05
    with TestClient(create_app({"gpt": gpt}, ServeLimits(request_timeout_s=30))) as client:
        body = {"inputs": [ids([[5]])], "parameters": {"max_new_tokens": 30, "timeout": 200_000}}  # 0.2 s
        started = time.monotonic()
        response = client.post("/v2/models/gpt/infer", json=body)
        assert response.status_code == 504 and time.monotonic() - started < 5
        body = {"inputs": [ids([[5]])], "parameters": {"max_new_tokens": 2, "timeout": 30_000_000, "priority": 0}}
        assert client.post("/v2/models/gpt/infer", json=body).status_code == 200
        for parameters, words in (({"priority": 2}, "parameters.priority"), ({"timeout": -1}, "parameters.timeout"),
                                  ({"timeout": 1.5}, "parameters.timeout")):
            body = {"inputs": [ids([[5]])], "parameters": {"max_new_tokens": 2, **parameters}}
            response = client.post("/v2/models/gpt/infer", json=body)
            assert response.status_code == 400 and words in response.json()["error"], response.text


def test_openapi_lists_the_v2_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{name}", "/v2/models/{name}/ready",
            "/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"} <= set(paths)
    assert "application/octet-stream" in paths["/v2/models/{name}/infer"]["post"]["requestBody"]["content"]


# -- end to end: Triton's client, a real server, tiny real models ------------------------------------------

def test_tritonclient_against_a_real_server(zoo, started):
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
    from hotrod.serve.worker import ModelWorker, ServeOptions

    options = ServeOptions(max_batch_size=4, max_queue_delay_ms=2.0, max_queue=64)
    workers = {name: started(ModelWorker(name, zoo.model(name, "torch"), options)) for name in ("gpt2", "bert")}
    with live_server(create_app(workers)) as url:
        _triton_calls(http, url.removeprefix("http://"))


def _triton_calls(http, url: str) -> None:
    client = http.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("gpt2")
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    assert [i["name"] for i in client.get_model_metadata("gpt2")["inputs"]] == ["text_input", "input_ids"]
    prompts = ["the quick brown", "hello world"]
    with httpx.Client(base_url=f"http://{url}", timeout=30) as v1:
        alone = [v1.post("/v1/generate", json={"model": "gpt2", "text": p, "max_new_tokens": 6}).json()["token_ids"]
                 for p in prompts]
        embedded = v1.post("/v1/embed", json={"model": "bert", "texts": prompts}).json()["embeddings"]
    prompt_ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12]], dtype=np.int64)
    by_ids = [httpx.post(f"http://{url}/v1/generate", json={"model": "gpt2", "token_ids": row.tolist(),
                                                             "max_new_tokens": 6}).json()["token_ids"]
              for row in prompt_ids]
    for as_binary in (True, False):
        texts = http.InferInput("text_input", [2], "BYTES")
        texts.set_data_from_numpy(np.array(prompts, dtype=object), binary_data=as_binary)
        wanted = [http.InferRequestedOutput(n, binary_data=as_binary) for n in ("output_ids", "output_lengths")]
        result = client.infer("gpt2", [texts], outputs=wanted, parameters={"max_new_tokens": 6})
        assert _rows(result) == alone
        tensor = http.InferInput("input_ids", [2, 4], "INT64")
        tensor.set_data_from_numpy(prompt_ids, binary_data=as_binary)
        result = client.infer("gpt2", [tensor], model_version="1", request_id="r1", parameters={"max_new_tokens": 6},
                              timeout=30_000_000)
        assert _rows(result) == by_ids and result.get_response()["id"] == "r1"
        texts = http.InferInput("text", [2], "BYTES")
        texts.set_data_from_numpy(np.array(prompts, dtype=object), binary_data=as_binary)
        result = client.infer("bert", [texts], outputs=[http.InferRequestedOutput("embeddings", as_binary)])
        np.testing.assert_allclose(result.as_numpy("embeddings"), embedded, rtol=1e-5, atol=1e-6)
    with pytest.raises(http.InferenceServerException, match="not an input of model 'bert'"):
        client.infer("bert", [http.InferInput("text_input", [1], "BYTES").set_data_from_numpy(
            np.array(["a"], dtype=object))])
    client.close()


def _rows(result) -> list[list[int]]:
    ids_, lengths = result.as_numpy("output_ids"), result.as_numpy("output_lengths")
    return [row[:n].tolist() for row, n in zip(ids_, lengths)]
