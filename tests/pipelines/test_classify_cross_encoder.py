"""`HotrodModel.classify` of a sentence-transformers cross-encoder scores as `CrossEncoder(path).predict` does:
the logits through the activation the config records (one-output and three-label heads), on onnxruntime and
torch and through an artifact; a function asked for still wins; an activation that cannot be built is one line.

The checkpoints are the zoo's tiny BERT with a classification head and the key sentence-transformers writes
into config.json (`sentence_transformers.activation_fn`), which CrossEncoder reads back from the same folder.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

import hotrod
import hotrod.pipelines.activation
from tests.pipelines.test_tasks import refused
from tests.zoo import CASES, CLASS_LABELS, build_checkpoint, head_case

PAIRS = [("the quick brown fox", "hello world"), ("the quick brown fox", "the lazy dog says hello"),
         ("a tiny model", "quick brown fox jumps over the dog"), ("hello", "hello world this is a tiny model")]
SIGMOID = "torch.nn.modules.activation.Sigmoid"
IDENTITY = "torch.nn.modules.linear.Identity"
ONE_LABEL = dict(num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})
CHECKPOINTS = {  # test id: (head config, the activation path config.json records)
    "one_sigmoid": (ONE_LABEL, SIGMOID),
    "one_identity": (ONE_LABEL, IDENTITY),
    "three_identity": ({}, IDENTITY),  # what CrossEncoder records for a head of several labels
    "three_sigmoid": ({}, SIGMOID),
}
RUNTIMES = ("onnxruntime", "torch")  # the backends test_sentence.py's parity table covers
ATOL = 1e-5


def _checkpoint(root, name: str, head: dict, path: str):
    case = head_case(CASES["bert"], "cls", initializer_range=0.2, sentence_transformers={"activation_fn": path},
                     **head)
    return build_checkpoint(dataclasses.replace(case, name=name), root / name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("cross_encoders")
    return {name: _checkpoint(root, name, *spec) for name, spec in CHECKPOINTS.items()}


def _scores(model: hotrod.HotrodModel, pairs, **kwargs) -> torch.Tensor:
    """classify's score of every label of every pair [pairs, labels], in the labels' order."""
    answers = model.classify(pairs, top_k=None, **kwargs)
    order = {label: i for i, label in model.labels.items()}
    rows = []
    for answer in answers:
        row = [0.0] * len(order)
        for entry in answer:
            row[order[entry["label"]]] = entry["score"]
        rows.append(row)
    return torch.tensor(rows)


def _predicted(checkpoint) -> torch.Tensor:
    """CrossEncoder.predict's scores as [pairs, labels] (a one-output head's [pairs] as one column)."""
    from sentence_transformers import CrossEncoder

    predicted = torch.as_tensor(CrossEncoder(str(checkpoint), device="cpu").predict(PAIRS))
    return predicted.reshape(len(PAIRS), -1).float()


def _logits(checkpoint) -> torch.Tensor:
    """transformers' logits of each pair, pair by pair."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        return torch.cat([model(**tokenizer(a, b, return_tensors="pt")).logits for a, b in PAIRS])


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_classify_scores_as_cross_encoder_predicts(checkpoints, name, runtime):
    expected = _predicted(checkpoints[name])
    model = hotrod.load(checkpoints[name], backend=runtime)
    torch.testing.assert_close(_scores(model, PAIRS), expected, atol=ATOL, rtol=0)
    best = model.classify(PAIRS)  # top_k not given: the best label and its score, as predict's argmax
    assert [b["label"] for b in best] == [model.labels[int(i)] for i in expected.argmax(dim=1)]
    assert [b["score"] for b in best] == pytest.approx(expected.max(dim=1).values.tolist(), abs=ATOL)


def test_the_scores_are_not_the_pipelines_default(checkpoints):
    """The three-label head's default would be a softmax and the one-output Identity head's a sigmoid:
    the cross-encoder's own activation gives the raw logits instead."""
    for name in ("three_identity", "one_identity"):
        model = hotrod.load(checkpoints[name], backend="torch")
        logits = _logits(checkpoints[name])
        torch.testing.assert_close(_scores(model, PAIRS), logits, atol=ATOL, rtol=0)
        assert (logits < 0).any() or (logits > 1).any()  # outside a sigmoid's or a softmax's range


@pytest.mark.parametrize("function", ["softmax", "sigmoid", "none"])
def test_a_function_asked_for_wins(checkpoints, function):
    logits = _logits(checkpoints["three_identity"])
    expected = {"softmax": logits.softmax(dim=-1), "sigmoid": logits.sigmoid(), "none": logits}[function]
    model = hotrod.load(checkpoints["three_identity"], backend="torch")
    torch.testing.assert_close(_scores(model, PAIRS, function_to_apply=function), expected, atol=ATOL, rtol=0)
    one = hotrod.load(checkpoints["one_identity"], backend="torch")
    one_logits = _logits(checkpoints["one_identity"])
    one_expected = one_logits.sigmoid() if function == "sigmoid" else one_logits if function == "none" else \
        torch.ones_like(one_logits)  # a softmax over one label
    torch.testing.assert_close(_scores(one, PAIRS, function_to_apply=function), one_expected, atol=ATOL, rtol=0)


def test_the_activation_travels_through_an_artifact(checkpoints, tmp_path):
    artifact = hotrod.optimize(checkpoints["three_sigmoid"], tmp_path / "art", progress=False, verify_examples=0)
    torch.testing.assert_close(_scores(hotrod.load(artifact), PAIRS), _predicted(checkpoints["three_sigmoid"]),
                               atol=ATOL, rtol=0)


def test_a_saved_cross_encoders_prompts_apply_as_predict_applies_them(checkpoints, tmp_path):
    """sentence-transformers 6 saves a CrossEncoder's prompts: predict puts the default (or the named) one before
    each pair's first text, and so do rerank and classify, through an artifact too."""
    from sentence_transformers import CrossEncoder

    source = tmp_path / "prompted"
    CrossEncoder(str(checkpoints["one_sigmoid"]), device="cpu", prompts={"query": "hello world ", "q2": "a "},
                 default_prompt_name="query").save(str(source))
    reference = CrossEncoder(str(source), device="cpu")
    query, documents = PAIRS[0][0], [b for _, b in PAIRS]
    for loaded in (hotrod.load(source, backend="torch"),
                   hotrod.load(hotrod.optimize(source, tmp_path / "art", progress=False, verify_examples=0))):
        for kwargs in ({}, {"prompt_name": "q2"}, {"prompt": "the "}):
            expected = torch.as_tensor(reference.predict([(query, d) for d in documents], **kwargs)).float()
            ranked = {r["index"]: r["score"] for r in loaded.rerank(query, documents, **kwargs)}
            torch.testing.assert_close(torch.tensor([ranked[i] for i in range(len(documents))]), expected,
                                       atol=ATOL, rtol=0)
            scores = _scores(loaded, [(query, d) for d in documents], **kwargs).reshape(-1)
            torch.testing.assert_close(scores, expected, atol=ATOL, rtol=0)
        refused(lambda m=loaded: m.rerank(query, documents, prompt_name="nope"), "unknown prompt_name 'nope'")
        refused(lambda m=loaded: m.rerank(query, documents, prompt="a", prompt_name="q2"), "not both")


def test_an_activation_outside_torch_falls_back_as_cross_encoder_does(tmp_path):
    """CrossEncoder without trust_remote_code builds no module outside torch: a one-output head gets its
    sigmoid, a head of several labels its logits (not the pipeline's softmax)."""
    for name, head in (("one", ONE_LABEL), ("three", {})):
        checkpoint = _checkpoint(tmp_path, name, head, "my_package.Scale")
        model = hotrod.load(checkpoint, backend="torch")
        torch.testing.assert_close(_scores(model, PAIRS), _predicted(checkpoint), atol=ATOL, rtol=0)


@pytest.mark.parametrize(("path", "message"), [
    ("torch.nn.NoSuchThing", "'torch.nn.NoSuchThing' in its config is not a torch module"),
    ("torch.nn.Linear", "'torch.nn.Linear' cannot be built without arguments"),
])
def test_an_activation_that_cannot_be_built_is_one_line(tmp_path, path, message):
    checkpoint = _checkpoint(tmp_path, "bad", {}, path)
    refused(lambda: hotrod.load(checkpoint, backend="torch").classify(PAIRS), message)
    assert hotrod.load(checkpoint, backend="torch").classify(PAIRS, function_to_apply="softmax")  # asked: no need


def test_a_plain_checkpoint_keeps_the_pipelines_default(tmp_path):
    """No activation recorded: not a cross-encoder, so transformers' pipeline defines the scores (softmax)."""
    checkpoint = build_checkpoint(head_case(CASES["bert"], "cls", initializer_range=0.2), tmp_path / "plain")
    model = hotrod.load(checkpoint, backend="torch")
    torch.testing.assert_close(_scores(model, PAIRS), _logits(checkpoint).softmax(dim=-1), atol=ATOL, rtol=0)
    assert tuple(model.labels.values()) == CLASS_LABELS


@pytest.mark.parametrize("activation", [SIGMOID, IDENTITY])
def test_a_cross_encoder_saved_by_sentence_transformers_scores_as_it_predicts(checkpoints, tmp_path, activation):
    """sentence-transformers 6 saves a CrossEncoder with a modules.json of its Transformer only and its
    activation in config_sentence_transformers.json: hotrod loads it as a classifier, scores with that
    activation (classify and rerank), and the artifact keeps it."""
    from sentence_transformers import CrossEncoder

    saved = tmp_path / "saved"
    encoder = CrossEncoder(str(checkpoints["one_sigmoid"]), device="cpu",
                           activation_fn=hotrod.pipelines.activation.torch_module(activation))
    encoder.save(str(saved))
    expected = torch.as_tensor(CrossEncoder(str(saved), device="cpu").predict(PAIRS)).float()
    artifact = hotrod.optimize(saved, tmp_path / "artifact", progress=False, verify_examples=0)
    for model in (hotrod.load(saved, backend="torch"), hotrod.load(artifact)):
        assert model.sentence is None
        torch.testing.assert_close(_scores(model, PAIRS)[:, 0], expected, atol=ATOL, rtol=0)
        ranked = model.rerank(PAIRS[0][0], [b for _, b in PAIRS[:2]])
        torch.testing.assert_close(torch.tensor([r["score"] for r in sorted(ranked, key=lambda r: r["index"])]),
                                   expected[:2], atol=ATOL, rtol=0)
