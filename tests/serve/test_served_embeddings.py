"""A served sentence-transformers checkpoint answers with `SentenceTransformer.encode`'s vectors on every
embedding route: OpenAI's /v1/embeddings (through the `openai` client's default call), hotrod's /v1/embed,
TEI's /embed, /embed_all, /tokenize and POST / (through huggingface_hub's InferenceClient against a real
server), and the Open Inference Protocol. Its default prompt, Dense layer, Normalize and max_seq_length
apply; what a request may change (prompt_name, normalize, dimensions, truncate) changes what encode's
arguments change, and a bad value is a 4xx naming its field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

import hotrod
from hotrod.serve.app import create_app
from hotrod.serve.worker import ModelWorker, ServeOptions
from tests.pipelines.test_sentence import PROMPTS, st_checkpoint
from tests.serve.live import live_server
from tests.zoo import CASES, build_checkpoint

st = pytest.importorskip("sentence_transformers")
openai = pytest.importorskip("openai")

TEXTS = ["the quick brown fox", "hello world this is a tiny model", "a"]
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)  # past max_seq_length
ATOL = 1e-5


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    backbone = build_checkpoint(CASES["bert"], tmp_path_factory.mktemp("backbone"))
    return st_checkpoint(backbone, tmp_path_factory.mktemp("st") / "st", modes=("cls",),
                         dense=((16, torch.nn.Tanh(), False),), normalize=True, prompts=PROMPTS,
                         default_prompt_name="query", max_seq_length=32)


@pytest.fixture(scope="module")
def reference(source):
    return st.SentenceTransformer(str(source), device="cpu")


@pytest.fixture(scope="module")
def app(source):
    worker = ModelWorker("st", hotrod.load(source, backend="onnxruntime"),
                         ServeOptions(max_batch_size=8, max_queue_delay_ms=1.0))
    worker.start()
    yield create_app({"st": worker})
    worker.stop(drain=False)


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as made:
        yield made


def _encode(reference, texts=TEXTS, **kwargs) -> np.ndarray:
    return reference.encode(texts, convert_to_numpy=True, **kwargs)


def test_the_openai_clients_default_call_gets_encodes_vectors(client, reference):
    api = openai.OpenAI(api_key="unused", base_url="http://testserver/v1", http_client=client)
    answer = api.embeddings.create(model="st", input=TEXTS)  # base64, the client's default
    np.testing.assert_allclose([item.embedding for item in answer.data], _encode(reference), atol=ATOL)
    cut = api.embeddings.create(model="st", input=TEXTS, dimensions=5)
    expected = _encode(reference, truncate_dim=5)
    np.testing.assert_allclose([item.embedding for item in cut.data],
                               expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=ATOL)
    named = api.embeddings.create(model="st", input=TEXTS, extra_body={"prompt_name": "passage"})
    np.testing.assert_allclose([item.embedding for item in named.data], _encode(reference, prompt_name="passage"),
                               atol=ATOL)


def test_v1_embed_runs_the_pipeline_and_its_overrides(client, source, reference):
    def post(**body):
        return np.array(client.post("/v1/embed", json={"texts": TEXTS, **body}).json()["embeddings"])

    np.testing.assert_allclose(post(), _encode(reference), atol=ATOL)
    np.testing.assert_allclose(post(prompt="hello "), _encode(reference, prompt="hello "), atol=ATOL)
    model = hotrod.load(source, backend="torch")
    np.testing.assert_allclose(post(normalize=False), model.embed(TEXTS, normalize=False).numpy(), atol=ATOL)
    np.testing.assert_allclose(post(pooling="mean"), model.embed(TEXTS, pooling="mean").numpy(), atol=ATOL)


def test_a_text_past_max_seq_length_is_cut_only_when_asked(client, reference):
    refused = client.post("/v1/embeddings", json={"input": [LONG]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"
    assert "truncate" in refused.json()["error"]["message"]
    cut = client.post("/v1/embeddings", json={"input": [LONG], "truncate": True}).json()["data"][0]["embedding"]
    np.testing.assert_allclose(cut, _encode(reference, [LONG])[0], atol=ATOL)
    tei = client.post("/embed", json={"inputs": LONG, "truncate": True}).json()
    np.testing.assert_allclose(tei, _encode(reference, [LONG]), atol=ATOL)
    assert client.post("/embed", json={"inputs": LONG, "truncate": None}).status_code == 400  # TEI's null: the default
    assert client.post("/embed_all", json={"inputs": "a", "truncate": None}).status_code == 200


def test_tei_embed_shapes_and_options(client, source, reference):
    one = client.post("/embed", json={"inputs": TEXTS[0]}).json()
    np.testing.assert_allclose(one, _encode(reference, TEXTS[:1]), atol=ATOL)
    named = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "passage", "dimensions": 4}).json()
    expected = _encode(reference, prompt_name="passage", truncate_dim=4)
    np.testing.assert_allclose(named, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=ATOL)
    raw = client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json()
    model = hotrod.load(source, backend="torch")
    np.testing.assert_allclose(raw, model.embed(TEXTS, normalize=False).numpy(), atol=ATOL)
    np.testing.assert_allclose(client.post("/", json={"inputs": TEXTS}).json(), _encode(reference), atol=ATOL)


def test_tei_embed_all_and_tokenize(client, source):
    model = hotrod.load(source, backend="torch")
    rows = model.tokenizer(["query: " + t for t in TEXTS])["input_ids"]
    states = client.post("/embed_all", json={"inputs": TEXTS}).json()
    hidden, _ = model.hidden_states(rows)
    for state, row, expected in zip(states, rows, hidden):
        np.testing.assert_allclose(state, expected[: len(row)].numpy(), atol=1e-4)
    tokens = client.post("/tokenize", json={"inputs": TEXTS[1], "prompt_name": "passage"}).json()[0]
    text = PROMPTS["passage"] + TEXTS[1]
    assert [t["id"] for t in tokens] == model.tokenizer(text)["input_ids"]
    assert tokens[0]["special"] and tokens[0]["start"] is None and not tokens[1]["special"]
    assert "".join(text[t["start"]:t["stop"]] for t in tokens if not t["special"]).replace(" ", "") == \
        text.replace(" ", "")



def test_tei_tokenize_counts_bytes_as_tei_does(client):
    """TEI's start and stop are UTF-8 byte offsets into the text the model reads (its prompt included): a token
    over a character of several bytes spans them all; the unknown token is a token of the text, not special."""
    text = "héllo wörld ✓ the fox"
    tokens = client.post("/tokenize", json={"inputs": text}).json()[0]
    whole = (PROMPTS["query"] + text).encode()
    words = [t for t in tokens if not t["special"]]
    assert [t["text"] for t in tokens if t["special"]] == ["[CLS]", "[SEP]"]
    assert all(whole[t["start"]:t["stop"]].decode() == t["text"] for t in words)
    assert {t["text"] for t in words if t["stop"] - t["start"] > len(t["text"])} == {"héllo", "wörld", "✓"}


def test_tei_decode_and_info(client, source):
    model = hotrod.load(source, backend="torch")
    rows = model.tokenizer(TEXTS)["input_ids"]
    assert client.post("/decode", json={"ids": rows}).json() == model.tokenizer.batch_decode(rows,
                                                                                             skip_special_tokens=True)
    kept = client.post("/decode", json={"ids": rows[0], "skip_special_tokens": False}).json()
    assert kept == [model.tokenizer.decode(rows[0])] and kept[0].startswith("[CLS]")
    assert client.post("/decode", json={"ids": []}).json() == [""]
    info = client.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "cls"}} and info["model_id"] == "st"
    assert info["max_input_length"] == 32  # the checkpoint's max_seq_length, below its positions

@pytest.mark.parametrize("path, body, field", [
    ("/v1/embeddings", {"input": TEXTS, "prompt_name": "nope"}, "prompt_name"),
    ("/embed", {"inputs": TEXTS, "prompt_name": "nope"}, "prompt_name"),
    ("/v1/embeddings", {"input": TEXTS, "dimensions": 17}, "dimensions"),
    ("/embed", {"inputs": TEXTS, "dimensions": 17}, "dimensions"),
    ("/embed", {"inputs": []}, "inputs"),
    ("/embed", {"inputs": ["fine", " "]}, "inputs"),
    ("/v1/embeddings", {"input": [[5, 6]], "prompt_name": "query"}, "prompt_name"),
    ("/v1/embeddings", {"input": TEXTS, "encoding_format": "hex"}, "encoding_format"),
    ("/tokenize", {"inputs": []}, "inputs"),
    ("/tokenize", {"inputs": "a " * 2000}, "inputs"),  # past the bytes of 64 tokens: never tokenized
    ("/tokenize", {"inputs": ["fine", "hello " * 100]}, "inputs"),  # past 64 tokens
    ("/decode", {"ids": [[5], [6, 10**6]]}, "ids"),  # outside the vocabulary
    ("/decode", {"ids": [5, -1]}, "ids"),
    ("/decode", {"ids": [[5]] * 300}, "ids"),  # past --max-batch-inputs
    ("/decode", {"ids": [5] * 100}, "ids"),  # past 64 tokens
    ("/decode", {"ids": "hello"}, "ids"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, "inputs"),
    ("/similarity", {"inputs": {"source_sentence": " ", "sentences": ["b"]}}, "inputs"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"prompt_name": "x"}},
     "prompt_name"),
])
def test_bad_input_is_a_4xx_naming_the_field(client, path, body, field):
    response = client.post(path, json=body)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()
    if path.startswith("/v1/"):  # OpenAI's shape
        assert error["error"]["param"] == field and "\n" not in error["error"]["message"]
    else:  # TEI's: the message names the field
        assert error["error"].startswith(field) and "\n" not in error["error"] and error["error_type"] == "validation"


def test_tei_routes_are_behind_the_api_key(source):
    from hotrod.serve.limits import Access

    worker = ModelWorker("st", hotrod.load(source, backend="torch"), ServeOptions())
    worker.start()
    try:
        with TestClient(create_app({"st": worker}, access=Access(api_key="secret"))) as guarded:
            for path in ("/", "/embed", "/embed_all", "/tokenize"):
                assert guarded.post(path, json={"inputs": "hello"}).status_code == 401, path
            ok = guarded.post("/embed", json={"inputs": "hello"}, headers={"Authorization": "Bearer secret"})
            assert ok.status_code == 200
    finally:
        worker.stop(drain=False)


def test_the_inference_protocol_serves_the_same_vectors(client, reference):
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}],
            "parameters": {"prompt_name": "passage"}}
    answer = client.post("/v2/models/st/infer", json=body).json()
    (output,) = answer["outputs"]
    got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, _encode(reference, prompt_name="passage"), atol=ATOL)


def test_huggingface_hubs_tei_client_gets_encodes_vectors(app, reference, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)  # the tests keep the hub offline; this is loopback
    with live_server(app) as base:
        info = hub.InferenceClient(model=base, provider="hf-inference").get_endpoint_info()
        assert info["model_type"] == {"embedding": {"pooling": "cls"}}
        for url in (base, f"{base}/embed"):
            client = hub.InferenceClient(model=url)
            got = client.feature_extraction(TEXTS[1])
            np.testing.assert_allclose(np.asarray(got).reshape(1, -1), _encode(reference, TEXTS[1:2]), atol=ATOL)
            named = client.feature_extraction(TEXTS[1], prompt_name="passage", normalize=True)
            np.testing.assert_allclose(np.asarray(named).reshape(1, -1),
                                       _encode(reference, TEXTS[1:2], prompt_name="passage"), atol=ATOL)
        scores = hub.InferenceClient(model=f"{base}/similarity").sentence_similarity(TEXTS[0], TEXTS[1:])
        vectors = _encode(reference, TEXTS)
        np.testing.assert_allclose(scores, vectors[1:] @ vectors[0], atol=ATOL)  # encode's are unit length
