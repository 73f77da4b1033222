"""hotrod classify / rerank / tag / answer: the task methods through the command line, text and JSON."""

from __future__ import annotations

import json

import pytest

from tests.pipelines.test_tasks import CONTEXT, TEXTS
from tests.test_cli import assert_one_error_line, ok, run


def test_classify_prints_what_the_api_answers(zoo, capsys):
    artifact, model = zoo.artifact("bert-cls"), zoo.model("bert-cls", "onnxruntime")
    assert json.loads(ok(capsys, "classify", artifact, *TEXTS[:2], "--json")) == model.classify(TEXTS[:2])
    pairs = json.loads(ok(capsys, "classify", artifact, TEXTS[0], "--pair", TEXTS[1], "--top-k", "all", "--json"))
    assert pairs == model.classify([(TEXTS[0], TEXTS[1])], top_k=None)
    assert ok(capsys, "classify", artifact, TEXTS[0]).startswith(model.classify(TEXTS[0])[0]["label"])


def test_tag_and_answer_print_what_the_api_answers(zoo, capsys, tmp_path):
    tagger, reader = zoo.artifact("bert-ner"), zoo.artifact("bert-qa")
    assert json.loads(ok(capsys, "tag", tagger, *TEXTS, "--aggregation", "first", "--json")) == \
        zoo.model("bert-ner", "onnxruntime").tag(TEXTS, aggregation_strategy="first")
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT)
    expected = zoo.model("bert-qa", "onnxruntime").answer("where is the dog", CONTEXT)
    assert json.loads(ok(capsys, "answer", reader, "--question", "where is the dog", "--context-file", context,
                         "--json")) == expected
    assert expected["answer"] in ok(capsys, "answer", reader, "--question", "where is the dog", "--context", CONTEXT)
    tokens = zoo.model("bert-qa", "onnxruntime").answer("where is the dog", CONTEXT, top_k=3, align_to_words=False)
    assert json.loads(ok(capsys, "answer", reader, "--question", "where is the dog", "--context", CONTEXT,
                         "--top-k", "3", "--no-align-to-words", "--json")) == tokens


@pytest.mark.parametrize(("argv", "match"), [
    (("classify", "bert-cls", "a", "--pair", "b", "--pair", "c"), "--pair was given 2 times for 1 texts"),
    (("classify", "bert-cls", " "), "text 0 is empty"),
    (("tag", "bert-cls", "hello"), "needs a token-classification model"),
    (("rerank", "bert-cls", "--query", "q", "d"), "one output"),
    (("answer", "bert-qa", "--question", "who", "--context", ""), "context is empty"),
    (("answer", "bert-qa", "--question", "who", "--context-file", "missing.txt"), "No such file"),
])
def test_bad_task_commands_are_one_line(zoo, capsys, argv, match):
    command, name, *rest = argv
    code, out, err = run(capsys, command, zoo.artifact(name), *rest)
    assert_one_error_line(code, out, err, 1, match)


def test_info_shows_the_task_and_labels(zoo, capsys):
    out = ok(capsys, "info", zoo.artifact("bert-cls"))
    assert "task        text-classification (labels: negative, neutral, positive)" in out


def test_optimize_task_overrides_the_checkpoints_head(zoo, capsys, tmp_path):
    out = tmp_path / "bare"
    ok(capsys, "optimize", zoo.checkpoint("bert-cls"), "--out", out, "--task", "feature-extraction",
       "--verify-examples", "2")
    assert "task        feature-extraction" in ok(capsys, "info", out)
    code, out_text, err = run(capsys, "optimize", zoo.checkpoint("bert-cls"), "--out", tmp_path / "x", "--task", "nope")
    assert code == 2 and "invalid choice" in err
