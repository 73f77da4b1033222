"""The task routes on real tiny heads: /v1/classify, /v1/rerank (Cohere's shape), TEI's /predict and /rerank,
and /v2 infer on heads. Each answers what the Python API answers, refuses what it must with a 4xx naming
the field, and runs its rows in the worker's dynamic batches with other requests' rows.
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

import hotrod
from hotrod.pipelines.base import Row
from hotrod.serve.app import create_app
from hotrod.serve.limits import Access, ServeLimits
from hotrod.serve.worker import ModelWorker, ServeOptions
from tests.serve.live import live_server
from tests.zoo import CASES, build_checkpoint, head_case

OPTIONS = ServeOptions(max_batch_size=64, max_queue_delay_ms=1.0)
QUERY = "the quick brown fox"
DOCUMENTS = ["hello world", "the lazy dog says hello", "a tiny model", "quick brown fox jumps over the dog"]
_RERANKER: dict[str, hotrod.HotrodModel] = {}


@pytest.fixture
def classifier(zoo) -> hotrod.HotrodModel:
    """bert with a three-label sequence classification head."""
    return zoo.model("bert-cls", "torch")


@pytest.fixture
def reranker(zoo) -> hotrod.HotrodModel:
    """bert with a one-label head: a cross-encoder (built once, on first use, beside the zoo's)."""
    if "model" not in _RERANKER:
        case = dataclasses.replace(head_case(CASES["bert"], "cls", num_labels=1), name="bert-rerank")
        _RERANKER["model"] = hotrod.load(build_checkpoint(case, zoo.root / "checkpoints" / case.name), backend="torch")
    return _RERANKER["model"]


@pytest.fixture
def serve(started):
    """A TestClient over workers of the given models, named by the dict's keys."""
    clients: list[TestClient] = []

    def make(models: dict, limits: ServeLimits | None = None, options: ServeOptions = OPTIONS,
             access: Access | None = None) -> TestClient:
        workers = {name: started(ModelWorker(name, model, options)) for name, model in models.items()}
        client = TestClient(create_app(workers, limits, access=access))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def assert_same_labels(actual, expected) -> None:
    """Equal answers, scores within float32 rounding (a batch's rows may run in other sub-batches)."""
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_labels(a, e)
        return
    assert actual["label"] == expected["label"]
    assert actual["score"] == pytest.approx(expected["score"], rel=1e-5, abs=1e-6)


def error(response: httpx.Response, status: int, param: str | None, *words: str) -> str:
    """The message of a refusal in hotrod's shape, naming `param` and holding `words`."""
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["param"] == param
    for word in words:
        assert word in body["message"], body["message"]
    return body["message"]


def tei_error(response: httpx.Response, status: int, *words: str) -> str:
    """The message of a refusal in TEI's shape, `{"error", "error_type"}`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == "validation"
    for word in words:
        assert word in body["error"], body["error"]
    return body["error"]


# -- /v1/classify ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("given", ["the quick brown fox", ["hello world", "a tiny model says hello"],
                                   [["the quick fox", "jumps over"], ["hello", "world"]]])
@pytest.mark.parametrize("top_k,raw", [(1, False), (None, False), (2, True)])
def test_classify_answers_as_the_python_api(serve, classifier, given, top_k, raw):
    client = serve({"cls": classifier})
    response = client.post("/v1/classify", json={"input": given, "top_k": top_k, "raw_scores": raw})
    assert response.status_code == 200, response.text
    body = response.json()
    shape = {} if top_k == 1 else {"top_k": top_k}  # the route's 1 is the pipeline's answer without top_k
    expected = classifier.classify(given, **shape, function_to_apply="none" if raw else None)
    assert_same_labels(body["results"], expected)
    assert body["model"] == "cls"
    assert body["usage"]["prompt_tokens"] > 0


# -- /v1/rerank (Cohere's shape) -------------------------------------------------------------------------

def _pair_scores(model, query: str, documents: list[str], function: str | None = None) -> list[float]:
    answers = model.classify([[query, doc] for doc in documents], function_to_apply=function)
    return [answer["score"] for answer in answers]


def test_rerank_in_cohere_shape(serve, reranker):
    client = serve({"rank": reranker})
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]
    response = client.post("/v1/rerank", json={"model": "rank", "query": QUERY, "documents": documents,
                                               "top_n": 3, "return_documents": True})
    assert response.status_code == 200, response.text
    body = response.json()
    scores = _pair_scores(reranker, QUERY, DOCUMENTS)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:3]
    assert [r["index"] for r in body["results"]] == order
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(scores[result["index"]], rel=1e-5)
        assert 0 < result["relevance_score"] < 1  # the cross-encoder's sigmoid
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    assert body["id"] and body["model"] == "rank"
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 0


def test_rerank_without_documents_or_top_n_returns_every_index_bare(serve, reranker):
    client = serve({"rank": reranker})
    body = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    assert sorted(r["index"] for r in body["results"]) == list(range(len(DOCUMENTS)))
    assert all(set(r) == {"index", "relevance_score"} for r in body["results"])
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)


# -- TEI's /predict and /rerank --------------------------------------------------------------------------

def _tei_labels(model, item) -> list[dict]:
    function = "sigmoid" if len(model.labels) == 1 else "softmax"
    return model.classify([item], top_k=None, function_to_apply=function)[0]


def test_tei_predict_shapes(serve, classifier):
    client = serve({"cls": classifier})
    one = client.post("/predict", json={"inputs": "the quick brown fox"})
    assert one.status_code == 200, one.text
    assert_same_labels(one.json(), _tei_labels(classifier, "the quick brown fox"))
    assert [p["label"] for p in one.json()] != [] and set(one.json()[0]) == {"score", "label"}
    pair = client.post("/predict", json={"inputs": ["the quick fox", "jumps"]}).json()
    assert_same_labels(pair, _tei_labels(classifier, ["the quick fox", "jumps"]))
    batch = client.post("/predict", json={"inputs": [["hello world"], ["the quick fox", "jumps"]]}).json()
    assert_same_labels(batch, [_tei_labels(classifier, "hello world"), _tei_labels(classifier, ["the quick fox",
                                                                                                "jumps"])])
    raw = client.post("/predict", json={"inputs": "hello", "raw_scores": True}).json()
    logits = classifier.run_rows([Row(classifier.tokenizer("hello")["input_ids"],
                                      classifier.tokenizer("hello")["token_type_ids"])])[0]["logits"]
    assert sorted(p["score"] for p in raw) == pytest.approx(sorted(logits.tolist()), rel=1e-5)


def test_tei_predict_takes_the_inference_apis_parameters(serve, classifier, monkeypatch):
    client = serve({"cls": classifier})
    every = client.post("/predict", json={"inputs": "hello", "truncate": None}).json()
    assert_same_labels(every, _tei_labels(classifier, "hello"))
    # with `parameters`, the Inference API's request: its answer is a list per input, one input too
    assert client.post("/predict", json={"inputs": "hello", "parameters": {}}).json() == [every]
    best = client.post("/predict", json={"inputs": "hello", "parameters": {"top_k": 1}}).json()
    assert best == [every[:1]]
    raw = client.post("/predict", json={"inputs": "hello", "raw_scores": True}).json()
    none = client.post("/predict", json={"inputs": "hello", "parameters": {"function_to_apply": "none"}}).json()
    assert none == [raw]
    tei_error(client.post("/predict", json={"inputs": "hello", "raw_scores": True,
                                            "parameters": {"function_to_apply": "softmax"}}), 400, "function_to_apply")
    tei_error(client.post("/predict", json={"inputs": "hello", "parameters": {"top_k": 0}}), 422, "top_k")
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)  # the tests keep the hub offline; this is loopback
    with live_server(client.app) as url:
        for target in (url, f"{url}/predict"):
            labels = hub.InferenceClient(model=target).text_classification("hello")
            assert [(x.label, pytest.approx(x.score)) for x in labels] == [(x["label"], x["score"]) for x in every]
            top = hub.InferenceClient(model=target).text_classification("hello", top_k=2, function_to_apply="none")
            assert [(x.label, pytest.approx(x.score)) for x in top] == [(x["label"], x["score"]) for x in raw[:2]]


def test_tei_rerank_shape(serve, reranker):
    client = serve({"rank": reranker})
    response = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert response.status_code == 200, response.text
    ranks = response.json()
    scores = _pair_scores(reranker, QUERY, DOCUMENTS, "sigmoid")
    assert [r["index"] for r in ranks] == sorted(range(len(scores)), key=lambda i: -scores[i])
    for rank in ranks:
        assert set(rank) == {"index", "text", "score"}
        assert rank["score"] == pytest.approx(scores[rank["index"]], rel=1e-5)
        assert rank["text"] == DOCUMENTS[rank["index"]]
    right = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "truncation_direction": "right"})
    assert right.json() == [{k: v for k, v in rank.items() if k != "text"} for rank in ranks]  # TEI's default
    raw = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}).json()
    logits = _pair_scores(reranker, QUERY, DOCUMENTS, "none")
    assert all("text" not in r for r in raw)
    assert [r["score"] for r in raw] == pytest.approx(sorted(logits, reverse=True), rel=1e-5)


# -- refusals --------------------------------------------------------------------------------------------

LONG = " ".join(["hello world"] * 40)  # past the tiny models' 64 positions


@pytest.mark.parametrize("path,body,status,param,words", [
    ("/v1/classify", {"model": "bert", "input": "hello"}, 400, "model", ("feature-extraction", "/v1/classify")),
    ("/v1/rerank", {"model": "cls", "query": "q", "documents": ["d"]}, 400, "model", ("3 labels",)),
    ("/v1/embed", {"model": "cls", "texts": ["hello"]}, 400, "model", ("text-classification", "no embeddings")),
    ("/v1/classify", {"model": "cls", "input": ""}, 400, "input", ("input[0]", "empty")),
    ("/v1/classify", {"model": "cls", "input": []}, 400, "input", ("empty",)),
    ("/v1/classify", {"model": "cls", "input": [["hello"]]}, 400, "input", ("pair of 1",)),
    ("/v1/classify", {"model": "cls", "input": [["hello", " "]]}, 400, "input", ("input[0][1]", "empty")),
    ("/v1/classify", {"model": "cls", "input": ["a", ["b", "c"]]}, 400, "input", ("mix",)),
    ("/v1/classify", {"model": "cls", "input": ["a"] * 9}, 400, "input", ("9 inputs", "--max-batch-inputs")),
    ("/v1/classify", {"model": "cls", "input": LONG}, 400, "input", ("tokens", "truncat")),
    ("/v1/classify", {"model": "cls", "input": [[LONG, "hello"]]}, 400, "input", ("pair 0", "tokens")),
    ("/v1/classify", {"model": "cls", "input": "hello", "top_k": 0}, 400, "top_k", ()),
    ("/v1/rerank", {"model": "rank", "query": "q", "documents": []}, 400, "documents", ("empty",)),
    ("/v1/rerank", {"model": "rank", "query": "", "documents": ["d"]}, 400, "query", ("empty",)),
    ("/v1/rerank", {"model": "rank", "query": "q", "documents": ["d", {"text": ""}]}, 400, "documents",
     ("documents[1]", "empty")),
    ("/v1/rerank", {"model": "rank", "query": "q", "documents": ["d"] * 9}, 400, "documents", ("9 inputs",)),
    ("/v1/rerank", {"model": "rank", "query": "q", "documents": [LONG]}, 400, "documents", ("tokens",)),
    ("/v1/rerank", {"model": "rank", "query": "q", "documents": [{"title": "d"}]}, 400, "documents", ()),
])
def test_refusals_name_the_field(serve, zoo, classifier, reranker, path, body, status, param, words):
    client = serve({"cls": classifier, "rank": reranker, "bert": zoo.model("bert", "torch")},
                   ServeLimits(max_batch_inputs=8))
    error(client.post(path, json=body), status, param, *words)


def test_truncate_runs_what_is_too_long_otherwise(serve, classifier, reranker):
    client = serve({"cls": classifier, "rank": reranker})
    response = client.post("/v1/classify", json={"model": "cls", "input": [[LONG, "hello"]], "truncate": True})
    assert response.status_code == 200, response.text
    assert_same_labels(response.json()["results"], classifier.classify([[LONG, "hello"]], truncate=True))
    response = client.post("/v1/rerank", json={"model": "rank", "query": "q", "documents": [LONG], "truncate": True})
    assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 64


def test_a_server_input_limit_below_the_model_is_named(serve, classifier):
    client = serve({"cls": classifier}, ServeLimits(max_input_tokens=8))
    error(client.post("/v1/classify", json={"input": "the quick brown fox jumps over the lazy dog"}), 400, "input",
          "at most 8")


def test_rerank_takes_at_most_ten_thousand_documents(serve, reranker):
    client = serve({"rank": reranker}, ServeLimits(max_batch_inputs=20_000))
    error(client.post("/v1/rerank", json={"query": "q", "documents": ["d"] * 10_001}), 400, "documents",
          "10001 inputs", "at most 10000")
    tei_error(client.post("/rerank", json={"query": "q", "texts": ["d"] * 10_001}), 400, "texts", "at most 10000")


@pytest.mark.parametrize("path,body,status,words", [
    ("/rerank", {"query": "q", "texts": []}, 400, ("texts", "empty")),
    ("/rerank", {"query": "q", "texts": [LONG]}, 400, ("texts", "tokens")),
    ("/rerank", {"query": "q"}, 422, ("texts",)),
    ("/predict", {"inputs": ["a", "b", "c"]}, 400, ("inputs", "3 strings")),
    ("/predict", {"inputs": [["a", "b", "c"]]}, 400, ("inputs[0]", "3 texts")),
    ("/predict", {"inputs": [["a"], [""]]}, 400, ("inputs[1]", "empty")),
    ("/predict", {"inputs": []}, 400, ("inputs", "empty")),
    ("/predict", {"inputs": "a", "truncation_direction": "left"}, 400, ("truncation_direction", "left")),
    ("/rerank", {"query": "q", "texts": ["d"], "truncation_direction": "Left"}, 400, ("truncation_direction", "Left")),
])
def test_tei_refusals_in_its_shape(serve, reranker, path, body, status, words):
    client = serve({"rank": reranker})
    tei_error(client.post(path, json=body), status, *words)


def test_tei_routes_need_one_model_of_their_task(serve, zoo, classifier, reranker):
    client = serve({"bert": zoo.model("bert", "torch"), "cls": classifier})
    tei_error(client.post("/rerank", json={"query": "q", "texts": ["d"]}), 400, "one label", "bert", "cls")
    assert client.post("/predict", json={"inputs": "hello"}).status_code == 200
    two = serve({"cls": classifier, "rank": reranker})
    tei_error(two.post("/predict", json={"inputs": "hello"}), 400, "several", "/v1/classify")



def test_tei_info_describes_the_one_model(serve, zoo, classifier, reranker):
    info = serve({"cls": classifier}).get("/info").json()
    labels = [classifier.labels[i] for i in sorted(classifier.labels)]
    assert info["model_type"] == {"classifier": {"id2label": {str(i): label for i, label in enumerate(labels)},
                                                 "label2id": {label: i for i, label in enumerate(labels)}}}
    assert (info["model_id"], info["model_dtype"], info["auto_truncate"]) == ("cls", "fp32", False)
    assert info["max_client_batch_size"] == ServeLimits().max_batch_inputs
    assert (info["max_batch_requests"], info["max_concurrent_requests"]) == (OPTIONS.max_batch_size, OPTIONS.max_queue)
    assert info["max_input_length"] == classifier.dims.max_positions
    assert info["max_batch_tokens"] == OPTIONS.max_batch_size * info["max_input_length"]
    assert list(serve({"rank": reranker}).get("/info").json()["model_type"]) == ["reranker"]
    tei_error(serve({"bert": zoo.model("bert", "torch"), "cls": classifier}).get("/info"), 400, "several", "bert",
              "cls", "/v1/models")
    tei_error(serve({"gpt": zoo.model("gpt2", "torch")}).get("/info"), 400, "none", "gpt")
    tei_error(serve({"ner": zoo.model("bert-ner", "torch")}).get("/info"), 400, "none", "ner")  # TEI serves no tagger

# -- the worker: rows of concurrent requests share one model call ----------------------------------------

def test_concurrent_requests_rows_share_one_model_call(started, reranker, classifier, monkeypatch):
    worker = started(ModelWorker("rank", reranker, ServeOptions(max_batch_size=64, max_queue_delay_ms=300)))
    calls: list[int] = []
    original = reranker.run_rows

    def counted(rows, batch_size=32):
        calls.append(len(rows))
        return original(rows, batch_size)

    monkeypatch.setattr(reranker, "run_rows", counted)
    app = create_app({"rank": worker})

    async def both():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await asyncio.gather(
                client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}),
                client.post("/rerank", json={"query": "hello", "texts": DOCUMENTS[:3]}))

    rerank, tei = asyncio.run(both())
    assert rerank.status_code == tei.status_code == 200
    assert calls == [len(DOCUMENTS) + 3]  # one call over both requests' rows
    monkeypatch.undo()
    scores = _pair_scores(reranker, "hello", DOCUMENTS[:3], "sigmoid")
    assert [r["score"] for r in tei.json()] == pytest.approx(sorted(scores, reverse=True), rel=1e-5)


# -- /v2 infer on heads, metrics, the API key ------------------------------------------------------------

def test_v2_infer_answers_a_heads_logits(serve, classifier):
    client = serve({"cls": classifier})
    ids = [[2, 30, 31, 3], [2, 40, 3]]
    response = client.post("/v2/models/cls/infer", json={"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": ids[0]}]})
    assert response.status_code == 200, response.text
    (logits,) = response.json()["outputs"]
    assert logits["name"] == "logits" and logits["shape"] == [1, 3]
    expected = classifier.run_rows([Row(ids[0])])[0]["logits"]
    assert logits["data"] == pytest.approx(expected.tolist(), rel=1e-5)
    texts = client.post("/v2/models/cls/infer", json={"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["hello world", "a tiny model"]}]})
    assert texts.json()["outputs"][0]["shape"] == [2, 3]
    metadata = client.get("/v2/models/cls").json()
    assert [o["name"] for o in metadata["outputs"]] == ["logits"]
    error_body = client.post("/v2/models/cls/infer", json={"parameters": {"pooling": "cls"}, "inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": ids[0]}]})
    assert error_body.status_code == 400 and "pooling" in error_body.json()["error"]


def test_v2_infer_pads_per_token_outputs_and_gives_lengths(serve, zoo):
    model = zoo.model("bert-qa", "torch")
    client = serve({"qa": model})
    response = client.post("/v2/models/qa/infer", json={"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["hello world", "a tiny model says hello"]}]})
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    lengths = outputs["lengths"]["data"]
    assert outputs["start_logits"]["shape"] == [2, max(lengths)]
    rows = [Row(model.tokenizer(t)["input_ids"]) for t in ("hello world", "a tiny model says hello")]
    expected = model.run_rows(rows)
    start = torch.tensor(outputs["start_logits"]["data"]).reshape(2, -1)
    for i, out in enumerate(expected):
        assert start[i, : lengths[i]].tolist() == pytest.approx(out["start_logits"].tolist(), rel=1e-5, abs=1e-6)
        assert start[i, lengths[i]:].abs().sum() == 0


def test_metrics_per_route_and_the_api_key(serve, reranker):
    client = serve({"rank": reranker}, access=Access(api_key="sesame"))
    assert client.post("/rerank", json={"query": "q", "texts": ["d"]}).status_code == 401
    assert client.post("/v1/rerank", json={"query": "q", "documents": ["d"]}).status_code == 401
    key = {"Authorization": "Bearer sesame"}
    assert client.post("/rerank", json={"query": "q", "texts": ["d"]}, headers=key).status_code == 200
    assert client.post("/v1/rerank", json={"query": "q", "documents": []}, headers=key).status_code == 400
    text = client.get("/metrics").text
    assert 'hotrod_requests_total{endpoint="tei_rerank",model="rank",outcome="ok"} 1.0' in text
    assert 'hotrod_requests_total{endpoint="tei_rerank",model="rank",outcome="invalid"} 1.0' in text
    assert 'hotrod_requests_total{endpoint="rerank",model="rank",outcome="invalid"} 2.0' in text  # 401 and 400


def test_openapi_lists_the_task_routes(serve, reranker):
    schema = serve({"rank": reranker}).get("/openapi.json").json()
    for path in ("/v1/classify", "/v1/rerank", "/predict", "/rerank"):
        assert "post" in schema["paths"][path]
    schemas = schema["components"]["schemas"]
    assert {"query", "documents", "top_n", "return_documents"} <= set(schemas["RerankRequest"]["properties"])
    assert {"query", "texts", "raw_scores", "return_text", "truncate"} <= set(schemas["TeiRerankRequest"]["properties"])
