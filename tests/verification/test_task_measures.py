"""Verification on the task's own measure: labels, rankings, entities and answers against the source's."""

from __future__ import annotations

import json
import re

import pytest
import torch

import hotrod
from hotrod.cli import main
from hotrod.verification import metrics
from hotrod.verification.compare import compare
from hotrod.verification.inputs import builtin_texts
from hotrod.verification.measures import ANSWERS, ENTITIES, LABELS, RANKING
from tests.zoo import CASES, HEAD_CASES, build_checkpoint, head_case

SCORE_NAMES = {"text-classification": "label agreement", "token-classification": "entity F1",
               "question-answering": "answer F1"}
# Tiny checkpoints whose random weights give varied answers (a larger initializer_range than the zoo's:
# with it, every text gets the same label), and the lowest score an int8 build of each may show: these
# random networks have far thinner margins than trained ones, so a few near-tied answers flip.
TASK_CASES = {
    "labels": (head_case(CASES["bert"], "cls", initializer_range=0.4), 0.9),
    "ranking": (head_case(CASES["bert"], "cls", num_labels=1, initializer_range=0.2), 0.75),
    "entities": (head_case(CASES["bert"], "ner", initializer_range=0.05), 0.95),
    "answers": (head_case(CASES["bert"], "qa", initializer_range=0.05), 0.9),
}
SCORES = {"labels": "label_agreement", "ranking": "rank_agreement", "entities": "entity_f1", "answers": "answer_f1"}


def builtin_examples(measure):
    """The built-in examples a measure makes of the built-in sentences."""
    return measure.from_texts(builtin_texts())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    return {name: build_checkpoint(case, root / name) for name, (case, _) in TASK_CASES.items()}


class Flipped:
    """A broken candidate: every head output negated (labels and tags become the least likely, rankings
    reverse, answers move), as a wrongly signed or mis-scaled graph would answer."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def run_rows(self, rows, batch_size=32):
        return [{name: -value for name, value in out.items()} for out in self.model.run_rows(rows, batch_size)]


def test_fp32_head_is_verified_on_its_task(zoo, head_case):
    figures = json.loads((zoo.artifact(head_case) / "manifest.json").read_text())["verification"]
    assert figures["score_name"] == SCORE_NAMES[HEAD_CASES[head_case].task]
    assert figures["score"] == 1.0
    measured = {"label agreement": "label_agreement", "entity F1": "entity_f1", "answer F1": "answer_exact_match"}
    assert figures[measured[figures["score_name"]]] == 1.0


@pytest.mark.parametrize("task", list(TASK_CASES))
def test_int8_build_within_the_task_gate_and_a_broken_one_caught(checkpoints, tmp_path, task):
    out = hotrod.optimize(checkpoints[task], tmp_path / "int8", precision="int8", verify_examples=16, progress=False)
    figures = json.loads((out / "manifest.json").read_text())["verification"]
    assert figures["score"] == figures[SCORES[task]] >= TASK_CASES[task][1]
    candidate, reference = hotrod.load(out), hotrod.load(checkpoints[task], backend="torch")
    examples = builtin_examples({"labels": LABELS, "ranking": RANKING, "entities": ENTITIES, "answers": ANSWERS}[task])
    broken = compare(Flipped(candidate), reference, examples[:16])
    assert broken["score"] < 0.5 and broken["score_name"] == figures["score_name"]


def test_ranking_groups_by_query_and_scores_given_targets(checkpoints, tmp_path):
    file = tmp_path / "rerank.tsv"
    file.write_text("which fox\tthe quick brown fox\t3\nwhich fox\tthe lazy dog\t1\nwhich fox\thello world\t0\n"
                    "a world\thello world\t2\na world\ta tiny model\t1\n")
    source = hotrod.load(checkpoints["ranking"], backend="torch")
    figures = hotrod.verify(hotrod.optimize(checkpoints["ranking"], tmp_path / "a", verify_examples=0,
                                            progress=False), texts=file)
    assert figures["queries"] == 2 and figures["rank_agreement"] == figures["top1_agreement"] == 1.0
    scores = [s["score"] for s in source.classify([("which fox", d) for d in
                                                  ("the quick brown fox", "the lazy dog", "hello world")])]
    scores += [s["score"] for s in source.classify([("a world", "hello world"), ("a world", "a tiny model")])]
    by_source = metrics.order_agreement([(scores[:3], [3, 1, 0]), (scores[3:], [2, 1])])
    assert figures["target_rank_agreement"] == figures["source_target_rank_agreement"] == by_source


def test_label_targets_give_accuracy_of_both_sides(checkpoints, tmp_path):
    source = hotrod.load(checkpoints["labels"], backend="torch")
    texts = ["the quick brown fox", "hello world", "a tiny model says hello"]
    predicted = [answer["label"] for answer in source.classify(texts)]
    wrong = next(label for label in source.labels.values() if label != predicted[0])
    file = tmp_path / "labels.tsv"
    file.write_text(f"{texts[0]}\t{wrong}\n{texts[1]}\t{predicted[1]}\n{texts[2]}\t{predicted[2]}\n")
    artifact = hotrod.optimize(checkpoints["labels"], tmp_path / "a", verify_texts=file, progress=False)
    figures = json.loads((artifact / "manifest.json").read_text())["verification"]
    assert figures["label_agreement"] == 1.0 and figures["examples_from"] == str(file)
    assert figures["target_accuracy"] == figures["source_target_accuracy"] == pytest.approx(2 / 3)


def test_answer_targets_are_scored_as_squad(checkpoints, tmp_path):
    file = tmp_path / "qa.tsv"
    file.write_text("where is the dog\tthe quick brown fox jumps over the lazy dog\tover the lazy dog\n")
    figures = hotrod.verify(hotrod.optimize(checkpoints["answers"], tmp_path / "a", verify_examples=0,
                                            progress=False), texts=file)
    assert figures["answer_f1"] == 1.0 and figures["examples"] == 1
    assert 0.0 <= figures["target_f1"] == figures["source_target_f1"] <= 1.0


def test_squad_metrics():
    assert metrics.normalize_answer("The  Lazy, dog!") == "lazy dog"
    assert metrics.answer_exact("the Lazy dog", "lazy dog.") == 1.0
    assert metrics.answer_f1("over the lazy dog", "lazy dog") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert metrics.answer_f1("fox", "dog") == 0.0 and metrics.answer_f1("", "") == 1.0


def test_entity_f1_and_order_agreement():
    theirs = [[("PER", 1, 3), ("LOC", 5, 6)], []]
    assert metrics.entity_f1(theirs, theirs) == (1.0, 1.0, 1.0)
    precision, recall, f1 = metrics.entity_f1([[("PER", 1, 3), ("PER", 5, 6)], [("LOC", 0, 1)]], theirs)
    assert (precision, recall) == (1 / 3, 1 / 2) and f1 == pytest.approx(0.4)
    assert metrics.order_agreement([([1, 2, 3, 4, 5], [1, 2, 3, 5, 4])]) == 0.9
    assert metrics.order_agreement([([3, 2, 1], [1, 2, 3])]) == 0.0
    assert metrics.top1_agreement([([0, 5], [0, 1]), ([5, 0], [0, 1])]) == 0.5


def test_entities_group_as_the_simple_strategy():
    from hotrod.verification.tokens import entities

    tags = [(1, "B-PER"), (2, "I-PER"), (3, "B-PER"), (4, "O"), (5, "I-LOC"), (6, "I-LOC"), (7, "I-PER")]
    assert entities(tags) == [("PER", 1, 3), ("PER", 3, 4), ("LOC", 5, 7), ("PER", 7, 8)]


def test_calibration_sees_the_task_inputs(checkpoints):
    from hotrod.optimize.calibration import capture_feeds

    for task in ("ranking", "answers"):
        model = hotrod.load(checkpoints[task])
        feeds = capture_feeds(model, builtin_texts()[:10], per_graph=64)["encoder"]
        assert all(f["token_type_ids"].max() == 1 for f in feeds)  # every input a pair: query/document, question/context
    windows = capture_feeds(hotrod.load(checkpoints["answers"]), builtin_texts()[:3], per_graph=64)["encoder"]
    assert len(windows) > 2  # long contexts are read in several windows


def test_auto_budgets_on_the_task_score(checkpoints, tmp_path):
    """A candidate whose labels are wrong is rejected by label agreement and never kept, however fast."""
    from hotrod.build import auto

    model = hotrod.load(checkpoints["labels"])
    reference = hotrod.load(checkpoints["labels"], backend="torch")
    models = {"fp32": model, "int8": Flipped(model)}
    winner, table = auto.choose(lambda p, d: p, models.__getitem__, reference, builtin_examples(LABELS)[:8],
                                list(models), max_drop=0.05, workdir=tmp_path)
    rows = {c.precision: c for c in table}
    assert rows["int8"].status == "rejected" and rows["int8"].drop > 0.5
    assert winner.precision == "fp32" and winner.figures["score_name"] == "label agreement"


@pytest.mark.parametrize("name", ["bert-cls", "bert-ner", "roberta-qa"])
def test_verify_cli_prints_task_figures(zoo, capsys, name):
    artifact = zoo.artifact(name)
    capsys.readouterr()
    assert main(["verify", str(artifact), "--examples", "3"]) == 0
    out = capsys.readouterr().out
    figure = {"bert-cls": "label_agreement", "bert-ner": "entity_f1", "roberta-qa": "answer_f1"}[name]
    assert f"{figure}" in out and "score_name" in out
    assert main(["info", str(zoo.artifact(name))]) == 0
    assert f"{SCORE_NAMES[HEAD_CASES[name].task]} 1.0000" in capsys.readouterr().out


@pytest.mark.parametrize("name, content, message", [
    ("bert-cls", "good text\tnegative\nbad text\tmaybe\n", r":2: label 'maybe' is not one of the model's labels"),
    ("bert-cls", "a\tb\tc\tnegative\n", r":1: expected text<TAB>label"),
    ("bert-qa", "only a question\n", r":1: expected question<TAB>context"),
    ("bert-ner", "fine\n\nnot\tplain\n", r":3: token-classification examples are plain texts"),
    ("gpt2", "\tno input\n", r":1: the input is empty"),
])
def test_a_malformed_task_file_is_one_line_naming_file_and_line(zoo, tmp_path, capsys, name, content, message):
    file = tmp_path / "examples.tsv"
    file.write_text(content)
    artifact = zoo.artifact(name)
    capsys.readouterr()  # building it may have written progress
    assert main(["verify", str(artifact), "--texts", str(file)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{file}:" in err
    assert re.search(message, err)


def test_a_reranking_score_must_be_a_number(checkpoints, tmp_path):
    file = tmp_path / "rerank.tsv"
    file.write_text("q\td\thigh\n")
    with pytest.raises(hotrod.HotrodError, match=r"rerank.tsv:1: the score 'high' is not a number"):
        hotrod.optimize(checkpoints["ranking"], tmp_path / "a", verify_texts=file, progress=False)
    assert not (tmp_path / "a").exists()


def test_flipped_is_not_the_model(checkpoints):
    """The broken candidate differs from the model it wraps (else the tests above prove nothing)."""
    model = hotrod.load(checkpoints["labels"])
    rows = [hotrod.pipelines.Row([2, 40, 41, 3])]
    assert not torch.equal(Flipped(model).run_rows(rows)[0]["logits"], model.run_rows(rows)[0]["logits"])
