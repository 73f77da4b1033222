"""`HotrodModel.rerank` beyond the parity of `test_tasks`: the activation sentence-transformers' CrossEncoder
resolves from the config (any torch module, the pre-v4 key, a sigmoid for a path outside torch), ties, long
documents, and refusals, each one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

import hotrod
from tests.pipelines.test_tasks import refused
from tests.zoo import CASES, build_checkpoint, head_case

QUERY = "the quick brown fox"
DOCUMENTS = ["hello world", "the lazy dog says hello", "a tiny model", "quick brown fox jumps over the dog",
             "hello world"]  # a repeated document: equal scores keep the documents' order
CONFIGS = {  # what a cross-encoder's config says of its activation -> the function CrossEncoder applies
    "none": ({}, torch.sigmoid),
    "identity": ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}, lambda x: x),
    "tanh": ({"sentence_transformers": {"activation_fn": "torch.nn.Tanh"}}, torch.tanh),
    "pre_v4_key": ({"sbert_ce_default_activation_function": "torch.nn.Identity"}, lambda x: x),
    "outside_torch": ({"sentence_transformers": {"activation_fn": "my_package.Scale"}}, torch.sigmoid),
}


def _checkpoint(root, name: str, **config) -> str:
    case = head_case(CASES["bert"], "cls", num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0},
                     initializer_range=0.2, **config)
    return build_checkpoint(dataclasses.replace(case, name=name), root / name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rerank")
    return {name: _checkpoint(root, name, **config) for name, (config, _) in CONFIGS.items()}


def _logits(checkpoint, query: str, documents: list[str]) -> torch.Tensor:
    """transformers' logit of each (query, document) pair, pair by pair (no padding: equal pairs score equal)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        return torch.cat([model(**tokenizer(query, doc, return_tensors="pt")).logits[:, 0] for doc in documents])


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_rerank_applies_the_activation_the_cross_encoder_would(checkpoints, kind):
    scores = CONFIGS[kind][1](_logits(checkpoints[kind], QUERY, DOCUMENTS)).tolist()
    ranking = hotrod.load(checkpoints[kind], backend="torch").rerank(QUERY, DOCUMENTS)
    assert [r["index"] for r in ranking] == sorted(range(len(scores)), key=lambda i: -scores[i])
    assert [r["score"] for r in ranking] == pytest.approx(sorted(scores, reverse=True), abs=1e-4)
    order = [r["index"] for r in ranking]
    assert ranking[order.index(0)]["score"] == ranking[order.index(4)]["score"] and order.index(0) < order.index(4)


def test_the_activation_travels_through_an_artifact(checkpoints, tmp_path):
    from sentence_transformers import CrossEncoder

    model = hotrod.load(hotrod.optimize(checkpoints["tanh"], tmp_path / "art", progress=False, verify_examples=0))
    theirs = CrossEncoder(str(checkpoints["tanh"]), device="cpu").rank(QUERY, DOCUMENTS[:-1])
    ours = model.rerank(QUERY, DOCUMENTS[:-1])
    assert [r["index"] for r in ours] == [r["corpus_id"] for r in theirs]
    assert [r["score"] for r in ours] == pytest.approx([float(r["score"]) for r in theirs], abs=1e-4)
    assert any(r["score"] < 0 for r in ours)  # tanh, not a sigmoid


def test_a_long_document_is_refused_or_cut(checkpoints):
    model = hotrod.load(checkpoints["none"], backend="torch")
    long = "the quick brown fox jumps over the lazy dog " * 20
    refused(lambda: model.rerank(QUERY, ["hello", long]), "document 1 has .* tokens, more than the model's 64 positions")
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoints["none"])
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoints["none"]).eval()
    with torch.no_grad():
        logit = hf(**tokenizer(QUERY, long, truncation="longest_first", max_length=64, return_tensors="pt")).logits
    assert model.rerank(QUERY, [long], truncate=True)[0]["score"] == pytest.approx(float(torch.sigmoid(logit)), abs=1e-4)
    assert len(model.rerank(QUERY, DOCUMENTS, top_n=50)) == len(DOCUMENTS)


@pytest.mark.parametrize(("path", "message"), [
    ("torch.nn.NoSuchThing", "'torch.nn.NoSuchThing' in its config is not a torch module"),
    ("torch.nn.Linear", "'torch.nn.Linear' cannot be built without arguments"),
])
def test_an_activation_that_cannot_be_built_is_one_line(tmp_path, path, message):
    checkpoint = _checkpoint(tmp_path, "bad", sentence_transformers={"activation_fn": path})
    refused(lambda: hotrod.load(checkpoint, backend="torch").rerank(QUERY, DOCUMENTS), message)


def test_a_document_that_is_not_text_is_one_line(checkpoints):
    refused(lambda: hotrod.load(checkpoints["none"], backend="torch").rerank(QUERY, ["hello", 3]),
            "document 1 must be a string")


def test_a_cross_encoders_max_length_is_where_documents_are_cut(checkpoints, tmp_path):
    """CrossEncoder(max_length=16) saves its limit as the tokenizer's model_max_length and cuts every pair there:
    a longer pair is refused, or with truncate cut where CrossEncoder cuts it."""
    from sentence_transformers import CrossEncoder

    saved = tmp_path / "ce16"
    CrossEncoder(str(checkpoints["none"]), max_length=16, device="cpu").save(str(saved))
    long = "a tiny model says hello to the quick brown fox and the lazy dog"
    theirs = CrossEncoder(str(saved), device="cpu").predict([(QUERY, long), (QUERY, "hello")])
    model = hotrod.load(saved, backend="torch")
    refused(lambda: model.rerank(QUERY, [long]), "document 0 has .* tokens, more than the 16 tokens its tokenizer "
                                                 "takes")
    ours = {r["index"]: r["score"] for r in model.rerank(QUERY, [long, "hello"], truncate=True)}
    assert [ours[0], ours[1]] == pytest.approx([float(t) for t in theirs], abs=1e-5)
