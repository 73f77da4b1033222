"""/v1/tag and /v1/answer on real tiny heads: what the Python API answers, the windows of a long context
batched as one submission, and every refusal a 400 naming its field."""

from __future__ import annotations

import pytest

from hotrod.serve.limits import ServeLimits
from tests.pipelines.test_tasks import CONTEXT, TEXTS
from tests.serve.test_heads import error, serve  # noqa: F401  (the fixture)


@pytest.fixture
def tagger(zoo):
    return zoo.model("bert-ner", "torch")


@pytest.fixture
def reader(zoo):
    return zoo.model("bert-qa", "torch")


def _same_entities(actual: list, expected: list) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert {k: v for k, v in a.items() if k != "score"} == {k: v for k, v in e.items() if k != "score"}
        assert a["score"] == pytest.approx(e["score"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("strategy", ["none", "simple", "average"])
def test_tag_answers_as_the_python_api(serve, tagger, strategy):  # noqa: F811
    client = serve({"ner": tagger})
    body = client.post("/v1/tag", json={"input": TEXTS, "aggregation_strategy": strategy}).json()
    for got, expected in zip(body["results"], tagger.tag(TEXTS, aggregation_strategy=strategy), strict=True):
        _same_entities([{k: v for k, v in e.items() if v is not None} for e in got], expected)
    assert body["usage"]["prompt_tokens"] > 0


def test_answer_runs_every_window_and_answers_as_the_python_api(serve, reader):  # noqa: F811
    client = serve({"qa": reader})
    request = {"question": "where is the dog", "context": CONTEXT, "max_seq_len": 24, "doc_stride": 6, "top_k": 2}
    body = client.post("/v1/answer", json=request).json()
    expected = reader.answer("where is the dog", CONTEXT, top_k=2, max_seq_len=24, doc_stride=6)
    assert [(a["answer"], a["start"], a["end"]) for a in body["answers"]] == \
        [(a["answer"], a["start"], a["end"]) for a in expected]
    assert body["windows"] > 1 and body["answers"][0]["score"] == pytest.approx(expected[0]["score"], rel=1e-5)
    tokens = client.post("/v1/answer", json={**request, "align_to_words": False}).json()["answers"]
    assert [a["answer"] for a in tokens] == \
        [a["answer"] for a in reader.answer("where is the dog", CONTEXT, top_k=2, max_seq_len=24, doc_stride=6,
                                            align_to_words=False)]


@pytest.mark.parametrize(("route", "payload", "param", "words"), [
    ("/v1/tag", {"input": []}, "input", ("empty",)),
    ("/v1/tag", {"input": ["ok", " "]}, "input", ("input[1]", "empty")),
    ("/v1/answer", {"question": "", "context": "hello"}, "question", ("empty",)),
    ("/v1/answer", {"question": "who", "context": ""}, "context", ("empty",)),
    ("/v1/answer", {"question": "the " * 70, "context": "hello"}, "question", ("max_question_len",)),
    ("/v1/answer", {"question": "who", "context": "hello", "doc_stride": 40, "max_seq_len": 32}, "doc_stride", ()),
    ("/v1/answer", {"question": "who", "context": CONTEXT * 4, "max_seq_len": 16, "doc_stride": 0}, "context",
     ("windows", "--max-batch-inputs")),
])
def test_bad_tag_and_answer_requests_are_400s_naming_the_field(serve, tagger, reader, route, payload, param,  # noqa: F811
                                                               words):
    client = serve({"ner": tagger, "qa": reader}, ServeLimits(max_batch_inputs=8))
    model = "ner" if route == "/v1/tag" else "qa"
    error(client.post(route, json={"model": model, **payload}), 400, param, *words)


def test_a_route_refuses_a_model_of_another_task(serve, tagger):  # noqa: F811
    client = serve({"ner": tagger})
    error(client.post("/v1/answer", json={"question": "who", "context": "hello"}), 400, "model",
          "question-answering")
