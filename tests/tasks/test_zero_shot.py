"""Zero-shot classification, a variant of text-classification over an NLI head: `model.zero_shot` against
transformers' `pipeline("zero-shot-classification")` on every backend, single- and multi-label, its rows
(every (text, label) pair in one batch, as text pairs), its verification measure, the `hotrod zero-shot`
command, the /v1/zero-shot route, and every refusal in one line.

Two tiny NLI heads: BERT's with entailment last ("contradiction", "neutral", "entailment"), and DistilBERT's
(no token types) with it first and upper case ("ENTAILMENT", ...), where contradiction is the last output.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import transformers

import hotrod
from hotrod.pipelines import zero_shot
from hotrod.tasks.constants import CLASSIFY, ZERO_SHOT
from hotrod.verification import measures
from hotrod.verification.compare import measure
from hotrod.verification.rows import task_rows
from tests.pipelines.test_tasks import refused
from tests.test_cli import assert_one_error_line, ok, run
from tests.zoo import CASES, build_checkpoint, head_case, load_on

NLI = {"bert": {0: "contradiction", 1: "neutral", 2: "entailment"},
       "distilbert": {0: "ENTAILMENT", 1: "NEUTRAL", 2: "CONTRADICTION"}}
TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world this is a tiny model", "a dog says hello"]
LABELS = ["hello", "the world", "a quick dog", "tiny"]
CALLS = [  # (sequences, candidate_labels, keyword arguments)
    (TEXTS[0], LABELS, {}),
    (TEXTS, LABELS, {"multi_label": True}),
    (TEXTS[:2], "hello, the world,,tiny ", {"hypothesis_template": "this is about {}"}),
    ([TEXTS[1]], ["hello"], {}),  # one label: entailment against contradiction, as multi_label
    (TEXTS[2], ["tiny", "tiny", "hello"], {}),  # equal labels: the pipeline's order of ties
]


def _checkpoint(root: Path, family: str) -> Path:
    labels = NLI[family]
    case = head_case(CASES[family], "cls", id2label=labels, label2id={v: k for k, v in labels.items()},
                     initializer_range=0.5)
    return build_checkpoint(dataclasses.replace(case, name=f"{family}-nli"), root / f"{family}-nli")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nli")
    return {family: _checkpoint(root, family) for family in NLI}


@pytest.fixture(scope="module")
def artifacts(checkpoints, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nli-artifacts")
    return {family: hotrod.optimize(checkpoint, root / family, progress=False, verify_examples=8)
            for family, checkpoint in checkpoints.items()}


def _model(checkpoints, artifacts, family: str, backend: str) -> hotrod.HotrodModel:
    return load_on(artifacts[family] if backend == "onnxruntime" else checkpoints[family], backend)


def _pipeline(checkpoint: Path):
    return transformers.pipeline("zero-shot-classification", model=str(checkpoint), tokenizer=str(checkpoint))


def assert_same(ours, theirs) -> None:
    """The pipeline's answer: the same shape, labels in its order, scores within 1e-4."""
    if isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_same(a, b)
        return
    assert ours["sequence"] == theirs["sequence"] and ours["labels"] == theirs["labels"]
    assert ours["scores"] == pytest.approx(theirs["scores"], abs=1e-4)


# -- the answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(NLI))
def test_zero_shot_equals_the_pipeline(checkpoints, artifacts, family, backend):
    model = _model(checkpoints, artifacts, family, backend)
    pipe = _pipeline(checkpoints[family])
    for sequences, labels, kwargs in CALLS:
        assert_same(model.zero_shot(sequences, labels, **kwargs), pipe(sequences, candidate_labels=labels, **kwargs))


def test_every_pair_is_a_row_of_one_batch(checkpoints, monkeypatch):
    model = hotrod.load(checkpoints["bert"], backend="torch")
    calls = []
    real = model.run_rows
    monkeypatch.setattr(model, "run_rows", lambda rows, *a, **k: calls.append(rows) or real(rows, *a, **k))
    model.zero_shot(TEXTS, LABELS, hypothesis_template="about {}")
    assert len(calls) == 1 and len(calls[0]) == len(TEXTS) * len(LABELS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoints["bert"])
    expected = tokenizer([t for t in TEXTS for _ in LABELS], [f"about {label}" for label in LABELS] * len(TEXTS))
    assert [r.input_ids for r in calls[0]] == expected["input_ids"]
    assert [r.token_type_ids for r in calls[0]] == expected["token_type_ids"]


def test_a_long_text_is_refused_or_cut_never_the_hypothesis(checkpoints):
    model = hotrod.load(checkpoints["bert"], backend="torch")
    long = "the quick brown fox jumps over the lazy dog " * 10
    refused(lambda: model.zero_shot(["hello", long], LABELS),
            "text 1 with candidate label 'hello' has .* tokens, more than the model's 64 positions")
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoints["bert"])
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoints["bert"]).eval()
    inputs = tokenizer(long, "This example is tiny.", truncation="only_first", max_length=64, return_tensors="pt")
    assert inputs["input_ids"].shape[1] == 64
    with torch.no_grad():
        logits = hf(**inputs).logits[0]
    expected = float(torch.softmax(logits[[0, 2]], dim=-1)[1])
    assert model.zero_shot(long, ["tiny"], truncate=True)["scores"] == pytest.approx([expected], abs=1e-4)
    refused(lambda: model.zero_shot("hello", ["tiny"], hypothesis_template="{} " + "the dog " * 40, truncate=True),
            "the text with candidate label 'tiny' has .* tokens, more than the model's 64 positions; shorten it$")


# -- the variant: which models answer it, and how they are verified --------------------------------


def test_an_nli_classifier_answers_both_and_verifies_on_premise_hypothesis_pairs(checkpoints, artifacts, tmp_path):
    model = hotrod.load(artifacts["bert"])
    assert model.task == CLASSIFY and model.task_spec.name == ZERO_SHOT
    assert measure(model) is measures.ZERO_SHOT
    assert model.classify("hello world")[0]["label"] in NLI["bert"].values()
    rows = task_rows(model, ["hello world", "a tiny model"])
    assert len(rows) == 2 and all(1 in row.token_type_ids for row in rows)  # premise, then the hypothesis
    manifest = json.loads((artifacts["bert"] / "manifest.json").read_text())
    assert manifest["task"] == CLASSIFY and manifest["verification"]["score_name"] == "label agreement"
    assert manifest["verification"]["score"] > 0.99
    examples = tmp_path / "nli.tsv"
    examples.write_text("a dog says hello\tThis example is a dog.\tentailment\nhello world\tthis is about tiny\n")
    figures = hotrod.verify(artifacts["bert"], texts=examples, examples=2)
    assert figures["examples"] == 2 and "target_accuracy" in figures and figures["label_agreement"] == 1.0
    examples.write_text("hello world\n")
    refused(lambda: hotrod.verify(artifacts["bert"], texts=examples), "nli.tsv:1: expected premise<TAB>hypothesis")
    examples.write_text("hello\tworld\tpositive\n")
    refused(lambda: hotrod.verify(artifacts["bert"], texts=examples), "nli.tsv:1: label 'positive' is not one")


def test_a_classifier_without_an_entailment_label_is_refused_in_one_line(zoo):
    model = zoo.model("bert-cls", "torch")
    assert model.task_spec.name == CLASSIFY
    refused(lambda: model.zero_shot("hello", LABELS), r"zero_shot\(\) needs an NLI head with an entailment label "
            r"\(a label2id key starting with 'entail'\); this one's labels are negative, neutral, positive$")
    refused(lambda: zoo.model("bert", "torch").zero_shot("hello", LABELS),
            r"zero_shot\(\) needs a text-classification model; this one is built for feature-extraction")


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.zero_shot("hello", []), "candidate_labels is empty; give at least one label"),
    (lambda m: m.zero_shot("hello", " , ,"), "candidate_labels is empty"),
    (lambda m: m.zero_shot("hello", [f"l{i}" for i in range(zero_shot.MAX_LABELS + 1)]),
     f"candidate_labels has {zero_shot.MAX_LABELS + 1} labels, more than the {zero_shot.MAX_LABELS} a call takes"),
    (lambda m: m.zero_shot("hello", ["a", " "]), r"candidate_labels\[1\] is empty"),
    (lambda m: m.zero_shot("hello", ["a", 3]), r"candidate_labels\[1\] must be a string"),
    (lambda m: m.zero_shot("hello", 3), "candidate_labels must be a list of labels or a comma-separated text"),
    (lambda m: m.zero_shot("hello", LABELS, hypothesis_template="This example is."),
     "hypothesis_template 'This example is.' has no place for the label; put {} where it goes"),
    (lambda m: m.zero_shot("hello", LABELS, hypothesis_template="about {topic}"), "has no place for the label"),
    (lambda m: m.zero_shot("hello", LABELS, hypothesis_template="{} and {}"), "has no place for the label"),
    (lambda m: m.zero_shot("hello", LABELS, hypothesis_template=None), "hypothesis_template must be a string"),
    (lambda m: m.zero_shot([], LABELS), "no texts to classify"),
    (lambda m: m.zero_shot(["hello", " "], LABELS), "text 1 is empty"),
    (lambda m: m.zero_shot("", LABELS), "the text is empty"),
    (lambda m: m.zero_shot(3, LABELS), "the texts must be a text or a list of texts, got int"),
    (lambda m: m.zero_shot("hello", LABELS, multi_label="yes"), "multi_label must be true or false"),
])
def test_bad_arguments_are_refused_in_one_line(checkpoints, call, message):
    refused(lambda: call(hotrod.load(checkpoints["bert"], backend="torch")), message)


# -- the command ------------------------------------------------------------------------------------


def test_the_command_answers_as_the_method(artifacts, capsys):
    model = hotrod.load(artifacts["bert"])
    argv = ("zero-shot", artifacts["bert"], *TEXTS[:2], "--labels", "hello,the world,tiny")
    assert json.loads(ok(capsys, *argv, "--json")) == model.zero_shot(TEXTS[:2], "hello,the world,tiny")
    multi = json.loads(ok(capsys, *argv, "--multi-label", "--template", "about {}", "--json"))
    assert_same(multi, model.zero_shot(TEXTS[:2], ["hello", "the world", "tiny"], hypothesis_template="about {}",
                                       multi_label=True))
    lines = ok(capsys, *argv).splitlines()
    first = model.zero_shot(TEXTS[0], "hello,the world,tiny")
    assert len(lines) == 2 and lines[0].endswith(f"\t{TEXTS[0]}")
    assert lines[0].startswith(f"{first['labels'][0]} {first['scores'][0]:.4f}  ")


def test_the_command_refuses_in_one_line(zoo, artifacts, capsys):
    assert_one_error_line(*run(capsys, "zero-shot", zoo.artifact("bert-cls"), "hello", "--labels", "a,b"), 1,
                          "needs an NLI head with an entailment label.*negative, neutral, positive")
    assert_one_error_line(*run(capsys, "zero-shot", artifacts["bert"], "hello", "--labels", "a", "--template", "x"),
                          1, "hypothesis_template 'x' has no place for the label")
    assert_one_error_line(*run(capsys, "zero-shot", artifacts["bert"], "hello", "--labels", ","), 1,
                          "candidate_labels is empty")
    assert_one_error_line(*run(capsys, "zero-shot", artifacts["bert"], "hello"), 2, "--labels")


# -- the route --------------------------------------------------------------------------------------


@pytest.fixture
def client(checkpoints, zoo):
    """/v1/zero-shot over the NLI head ("nli") and a sentiment head without entailment ("sentiment"), at most 8
    rows a request."""
    from fastapi.testclient import TestClient

    from hotrod.serve.app import create_app
    from hotrod.serve.limits import ServeLimits
    from hotrod.serve.worker import ModelWorker, ServeOptions

    models = {"nli": hotrod.load(checkpoints["bert"], backend="torch"), "sentiment": zoo.model("bert-cls", "torch")}
    workers = {name: ModelWorker(name, model, ServeOptions(max_queue_delay_ms=1.0)) for name, model in models.items()}
    for worker in workers.values():
        worker.start()
    try:
        with TestClient(create_app(workers, ServeLimits(max_batch_inputs=8))) as made:
            yield made
    finally:
        for worker in workers.values():
            worker.stop(drain=False)


def _refusal(response, param: str, *words: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()["error"]
    assert body["param"] == param and "\n" not in body["message"]
    for word in words:
        assert word in body["message"], body["message"]


def test_the_route_answers_as_the_method(client, checkpoints):
    model = hotrod.load(checkpoints["bert"], backend="torch")
    body = client.post("/v1/zero-shot", json={"model": "nli", "input": TEXTS[:2], "candidate_labels": LABELS,
                                              "multi_label": True}).json()
    assert body["model"] == "nli" and body["usage"]["prompt_tokens"] > 0
    assert_same(body["results"], model.zero_shot(TEXTS[:2], LABELS, multi_label=True))
    one = client.post("/v1/zero-shot", json={"model": "nli", "input": TEXTS[0], "candidate_labels": "hello, tiny",
                                             "hypothesis_template": "about {}"}).json()
    assert_same(one["results"], [model.zero_shot(TEXTS[0], ["hello", "tiny"], hypothesis_template="about {}")])


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"model": "sentiment", "candidate_labels": ["a"]}, "model",
     ("/v1/zero-shot needs an NLI head with an entailment label", "negative, neutral, positive")),
    ({"candidate_labels": []}, "candidate_labels", ("candidate_labels is empty",)),
    ({"candidate_labels": ["a", " "]}, "candidate_labels", ("candidate_labels[1]: the text is empty",)),
    ({"candidate_labels": [f"l{i}" for i in range(zero_shot.MAX_LABELS + 1)]}, "candidate_labels",
     (f"more than the {zero_shot.MAX_LABELS} a call takes",)),
    ({"input": ["a", "b", "c"], "candidate_labels": ["a", "b", "c"]}, "candidate_labels",
     ("3 texts with 3 labels make 9 (text, label) pairs; this server runs at most 8",)),
    ({"input": [f"t{i}" for i in range(9)]}, "input", ("9 inputs; this server takes at most 8",)),
    ({"input": []}, "input", ("the list is empty",)),
    ({"input": ["hello", ""]}, "input", ("input[1]: the text is empty",)),
    ({"hypothesis_template": "no place"}, "hypothesis_template", ("has no place for the label",)),
    ({"input": "the quick brown fox " * 20}, "input", ("text 0 with candidate label 'a' has 94 tokens",)),
])
def test_the_route_refuses_naming_the_field(client, body, param, words):
    request = {"model": "nli", "input": "hello", "candidate_labels": ["a"], **body}
    _refusal(client.post("/v1/zero-shot", json=request), param, *words)


@pytest.mark.parametrize("limit", [5, 12])
def test_a_tokenizer_limit_below_the_positions_cuts_as_the_pipeline(checkpoints, tmp_path, limit):
    """The pipeline cuts the text where the tokenizer's model_max_length says; where even the hypothesis does not
    fit there, it runs the pair uncut (within the positions), and so does zero_shot."""
    import json
    import shutil

    source = Path(shutil.copytree(checkpoints["bert"], tmp_path / "limited"))
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": limit}))
    model = hotrod.load(source, backend="torch")
    assert_same(model.zero_shot(TEXTS[0], LABELS, truncate=True), _pipeline(source)(TEXTS[0], candidate_labels=LABELS))
