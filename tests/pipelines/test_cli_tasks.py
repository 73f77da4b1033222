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


LONG = "the quick brown fox jumps over the lazy dog " * 10  # past the zoo's 64 positions


def test_truncate_cuts_long_inputs_as_the_api_does(zoo, capsys):
    tagged = json.loads(ok(capsys, "tag", zoo.artifact("bert-ner"), LONG, "--truncate", "--json"))
    assert tagged == zoo.model("bert-ner", "onnxruntime").tag([LONG], aggregation_strategy="simple", truncate=True)
    labels = json.loads(ok(capsys, "classify", zoo.artifact("bert-cls"), LONG, "--truncate", "--json"))
    assert labels == zoo.model("bert-cls", "onnxruntime").classify([LONG], truncate=True)
    code, out, err = run(capsys, "tag", zoo.artifact("bert-ner"), LONG)
    assert_one_error_line(code, out, err, 1, "text 0 has .* tokens, more than the model's 64 positions")


@pytest.mark.parametrize(("argv", "status", "match"), [
    (("classify", "bert-cls", "a", "--pair", "b", "--pair", "c"), 1, "--pair was given 2 times for 1 texts"),
    (("classify", "bert-cls", " "), 1, "text 0 is empty"),
    (("classify", "bert-cls", "hello", "--top-k", "0"), 1, "top_k must be"),
    (("classify", "bert-cls", "hello", "--top-k", "some"), 2, "expected a whole number or all"),
    (("classify", "bert-ner", "hello"), 1, "needs a text-classification model; this one is built for token-class"),
    (("tag", "bert-cls", "hello"), 1, "needs a token-classification model"),
    (("tag", "bert-ner", "hi", "--aggregation", "longest"), 2, "invalid choice"),
    (("rerank", "bert-cls", "--query", "q", "d"), 1, "one output"),
    (("rerank", "bert-cls", "hello"), 2, "--query"),
    (("answer", "bert-qa", "--question", "who", "--context", ""), 1, "context is empty"),
    (("answer", "bert-qa", "--question", "who", "--context-file", "missing.txt"), 1, "No such file"),
    (("answer", "bert-qa", "--question", "who", "--context", "a", "--context-file", "f"), 2, "not allowed with"),
    (("answer", "bert-qa", "--question", "the fox " * 40, "--context", "a dog"), 1, "more than max_question_len"),
    (("answer", "bert-qa", "--question", "who", "--context", LONG, "--doc-stride", "70"), 1,
     "doc_stride \\(70\\) is larger than max_seq_len \\(64\\)"),
])
def test_bad_task_commands_are_one_line(zoo, capsys, argv, status, match):
    command, name, *rest = argv
    code, out, err = run(capsys, command, zoo.artifact(name), *rest)
    assert_one_error_line(code, out, err, status, match)


def test_a_context_file_that_is_not_utf8_is_one_line(zoo, capsys, tmp_path):
    file = tmp_path / "context.txt"
    file.write_bytes("caf\xe9 au lait".encode("latin-1"))
    code, out, err = run(capsys, "answer", zoo.artifact("bert-qa"), "--question", "who", "--context-file", file)
    assert_one_error_line(code, out, err, 1, "is not UTF-8")


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
