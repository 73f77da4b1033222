"""`HotrodModel.answer` beyond the parity of `test_tasks`: the 4.x pipeline's defaults and input forms, the
stride it lowers beside a long question, and its refusals, each one line."""

from __future__ import annotations

import pytest

from tests.pipelines.test_tasks import refused

SHORT = "the quick brown fox jumps over the lazy dog"
LONG = " ".join(["the quick brown fox jumps over the lazy dog", "hello world this is a tiny model",
                 "a small model says hello to the whole world", "the lazy dog says hello to the quick fox"] * 3)


def test_defaults_are_the_pipelines_within_the_positions(zoo):
    """384-token windows sharing 128 by default, within the model's 64 positions: 64 sharing 32."""
    model = zoo.model("bert-qa", "onnxruntime")
    assert model.answer("who says hello", LONG) == model.answer("who says hello", LONG, max_seq_len=64, doc_stride=32)


def test_several_questions_answer_each(zoo):
    model = zoo.model("bert-qa", "onnxruntime")
    one, two = model.answer("where is the dog", SHORT), model.answer("who says hello", LONG)
    assert model.answer([("where is the dog", SHORT), ("who says hello", LONG)]) == [one, two]
    assert model.answer([{"question": "where is the dog", "context": SHORT}]) == [one]
    assert model.answer(["where is the dog", "who says hello"], [SHORT, LONG]) == [one, two]
    assert model.answer(["where is the dog", "who jumps"], SHORT) == [one, model.answer("who jumps", SHORT)]
    assert isinstance(model.answer("where is the dog", SHORT, top_k=2), list)


def test_a_context_without_a_possible_span_answers_empty(zoo):
    """A context whose characters all tokenize to nothing: the pipeline's answer is [CLS]'s empty span, alone
    even when more were asked for (transformers 4.57's answer under numpy 2)."""
    model = zoo.model("bert-qa", "onnxruntime")
    empty = {"score": 0.0, "start": 0, "end": 0, "answer": ""}
    assert model.answer("who", "\x00\x00") == empty and model.answer("who", "\x00\x00", top_k=2) == empty


def test_the_default_stride_fits_beside_a_long_question(zoo):
    """The pipeline's default stride (32 of a 64-token window) fails beside a 29-token question, which
    leaves 32 tokens for the context; hotrod lowers it to 31, and refuses the same stride given."""
    model = zoo.model("bert-qa", "torch")
    question = "is the quick brown fox the one who jumps over the lazy dog or the dog who says hello to the world"
    refused(lambda: model.answer(question, LONG, doc_stride=32),
            r"doc_stride \(32\) must be less than the 32 context tokens a window of 64 holds beside the question")
    assert model.answer(question, LONG) == model.answer(question, LONG, doc_stride=31)
    assert model.answer(question, SHORT, doc_stride=32)["answer"] in SHORT  # one window: no stride needed


BAD = {
    "empty_question": ("bert-qa", lambda m: m.answer(" ", SHORT), "the question is empty"),
    "no_context": ("bert-qa", lambda m: m.answer("who"), "a question needs a context"),
    "context_not_text": ("bert-qa", lambda m: m.answer("who", 3), "context must be a string, got int"),
    "not_a_list": ("bert-qa", lambda m: m.answer(3), "give a question and a context"),
    "pair_missing_a_side": ("bert-qa", lambda m: m.answer([("who", SHORT), ("who",)]),
                            "input 1 must be a \\(question, context\\) pair"),
    "pair_empty_side": ("bert-qa", lambda m: m.answer([("who", SHORT), ("who", " ")]), "context 1 is empty"),
    "unknown_key": ("bert-qa", lambda m: m.answer([{"question": "who", "text": SHORT}]), "unknown key\\(s\\) text"),
    "uneven_lists": ("bert-qa", lambda m: m.answer(["who", "what"], [SHORT]), "2 questions and 1 contexts"),
    "question_past_the_window": ("bert-qa", lambda m: m.answer("the quick brown fox " * 6, LONG, max_seq_len=24),
                                 "the question \\(.* tokens\\) leaves no room for its context in a window of 24"),
    "listed_question_too_long": ("bert-qa", lambda m: m.answer([("who", SHORT), ("the quick brown fox " * 20, SHORT)]),
                                 "question 1 has .* tokens, more than max_question_len \\(64\\)"),
    "stride_past_window": ("bert-qa", lambda m: m.answer("who", SHORT, max_seq_len=32, doc_stride=40),
                           "doc_stride \\(40\\) is larger than max_seq_len \\(32\\)"),
    "negative_stride": ("bert-qa", lambda m: m.answer("who", SHORT, doc_stride=-1), "doc_stride must be an integer >= 0"),
    "top_k_zero": ("bert-qa", lambda m: m.answer("who", SHORT, top_k=0), "top_k must be an integer >= 1"),
    "max_answer_len_zero": ("bert-qa", lambda m: m.answer("who", SHORT, max_answer_len=0), "max_answer_len"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_answer_is_one_line(zoo, bad):
    name, call, message = BAD[bad]
    model = zoo.model(name, "torch")
    refused(lambda: call(model), message)
