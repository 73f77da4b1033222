"""The task methods against what transformers (and sentence-transformers) answer on the same checkpoint.

Token classification against transformers' pipeline; reranking against sentence-transformers'
CrossEncoder; question answering (whose pipeline transformers 5 removed) against that pipeline's
algorithm written out plainly over transformers' own logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import hotrod
from tests.zoo import BERT_WORDS, CASES, ENCODER_CASES, head_case

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world this is a tiny model",
         "a quick dog says hello to the brown fox"]
CONTEXT = " ".join(BERT_WORDS * 3)
# The task methods read text: every encoder family whose test case has a tokenizer.
TEXT_CASES = [name for name in ENCODER_CASES if CASES[name].tokenizer is not None]


@pytest.fixture(scope="module", params=TEXT_CASES)
def cross_encoder_case(request):
    return head_case(CASES[request.param], "cls", num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})


def refused(call, message: str) -> None:
    """`call()` raises a HotrodError matching `message`, in one line."""
    with pytest.raises(hotrod.HotrodError, match=message) as caught:
        call()
    assert "\n" not in str(caught.value)


def _close(ours, theirs):
    """Entity lists equal, scores within 1e-4."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        for key in a:
            if key == "score":
                assert abs(a[key] - float(b[key])) <= 1e-4
            else:
                assert a[key] == b[key], key


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
@pytest.mark.parametrize("family", TEXT_CASES)
def test_tag_equals_the_token_classification_pipeline(zoo, family, strategy):
    model = zoo.model(f"{family}-ner", "onnxruntime")
    pipe = transformers.pipeline("token-classification", model=zoo.reference(f"{family}-ner"),
                                 tokenizer=model.tokenizer, aggregation_strategy=strategy)
    ours = model.tag(TEXTS, aggregation_strategy=strategy)
    assert len(ours) == len(TEXTS) and any(ours)
    for text, entities in zip(TEXTS, ours):
        _close(entities, pipe(text))
    _close(model.tag(TEXTS[0], aggregation_strategy=strategy), pipe(TEXTS[0]))  # one text: one list


def test_rerank_scores_as_cross_encoder_predicts(zoo, cross_encoder_case, tmp_path):
    from sentence_transformers import CrossEncoder

    from tests.zoo import build_checkpoint

    checkpoint = build_checkpoint(cross_encoder_case, tmp_path / "ce")
    model = hotrod.load(hotrod.optimize(checkpoint, tmp_path / "art", progress=False, verify_examples=2))
    expected = CrossEncoder(str(checkpoint), device="cpu").predict([("hello world", t) for t in TEXTS])
    ranked = model.rerank("hello world", TEXTS)
    assert [r["index"] for r in ranked] == list(np.argsort(-expected, kind="stable"))
    for r in ranked:
        assert abs(r["score"] - float(expected[r["index"]])) <= 1e-4
    assert len(model.rerank("hello world", TEXTS, top_n=2)) == 2


def reference_answer(zoo, name: str, question: str, context: str, top_k: int = 1, max_seq_len: int = 24,
                     doc_stride: int = 6, max_answer_len: int = 15, impossible: bool = False,
                     align_to_words: bool = True):
    """transformers 4.x's QA pipeline written out plainly over transformers' own model: each window's start
    and end softmaxed over its context and [CLS], its best top_k * 2 + 10 spans (top_k without word
    alignment; start x end, at most `max_answer_len` tokens) widened to whole words, an answer found
    again (without case) adding its score, the empty answer at the lowest [CLS] score when allowed."""
    tokenizer = zoo.model(name, "onnxruntime").tokenizer
    encoded = tokenizer(question, context, truncation="only_second", max_length=max_seq_len, stride=doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
    found: dict[str, dict] = {}
    null = 1e6
    for w, ids in enumerate(encoded["input_ids"]):
        inputs = {"input_ids": torch.tensor([ids])}
        if zoo.model(name, "onnxruntime").dims.type_vocab_size > 1:
            inputs["token_type_ids"] = torch.tensor([encoded["token_type_ids"][w]])
        with torch.no_grad():
            out = zoo.reference(name)(**inputs)
        allowed = torch.tensor([i == 0 or s == 1 for i, s in enumerate(encoded.sequence_ids(w))])
        start = out.start_logits[0].masked_fill(~allowed, -10000.0).softmax(-1)
        end = out.end_logits[0].masked_fill(~allowed, -10000.0).softmax(-1)
        null = min(null, float(start[0] * end[0]))
        spans = sorted(((float(start[s] * end[e]), s, e) for s in range(1, len(ids))
                        for e in range(s, min(len(ids), s + max_answer_len)) if allowed[s] and allowed[e]),
                       reverse=True)[: top_k * 2 + 10 if align_to_words else top_k]
        words = encoded.encodings[w]
        for score, s, e in spans:
            first, last = words.offsets[s][0], words.offsets[e][1]
            if align_to_words:
                first = words.word_to_chars(words.token_to_word(s), sequence_index=1)[0]
                last = words.word_to_chars(words.token_to_word(e), sequence_index=1)[1]
            text = context[first:last]
            if text.lower() in found:
                found[text.lower()]["score"] += score
            else:
                found[text.lower()] = {"score": score, "start": first, "end": last, "answer": text}
    answers = list(found.values()) + ([{"score": null, "start": 0, "end": 0, "answer": ""}] if impossible else [])
    answers = sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
    return answers if top_k > 1 else answers[0]


QUESTIONS = {  # (question, options): windows of 24 tokens sharing 6 unless an option says otherwise
    "windows": ("where is the lazy dog", {"max_answer_len": 5}),
    "top_k": ("who says hello", {"top_k": 3}),
    "short_answers": ("where", {"top_k": 5, "max_answer_len": 3, "max_seq_len": 64, "doc_stride": 32}),
    "impossible": ("what is this", {"top_k": 2, "impossible": True, "max_seq_len": 64, "doc_stride": 32}),
    "tokens_not_words": ("who says hello", {"top_k": 3, "align_to_words": False}),
}


@pytest.mark.parametrize("asked", list(QUESTIONS))
@pytest.mark.parametrize("family", TEXT_CASES)
def test_answer_searches_every_window_as_the_pipeline_did(zoo, family, asked):
    question, options = QUESTIONS[asked]
    options = {"max_seq_len": 24, "doc_stride": 6, **options}
    expected = reference_answer(zoo, f"{family}-qa", question, CONTEXT, **options)
    options["handle_impossible_answer"] = options.pop("impossible", False)
    got = zoo.model(f"{family}-qa", "onnxruntime").answer(question, CONTEXT, **options)
    for a, b in zip(got if isinstance(got, list) else [got], expected if isinstance(expected, list) else [expected],
                    strict=True):
        assert (a["answer"], a["start"], a["end"]) == (b["answer"], b["start"], b["end"])
        assert abs(a["score"] - b["score"]) <= 1e-4 and a["answer"] == CONTEXT[a["start"]:a["end"]]


def test_answer_with_no_answer_allowed_adds_the_null_score(zoo):
    model = zoo.model("bert-qa", "onnxruntime")
    answers = model.answer("who", TEXTS[0], top_k=50, handle_impossible_answer=True)
    assert {"answer": "", "start": 0, "end": 0} in [{k: a[k] for k in ("answer", "start", "end")} for a in answers]


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m["ner"].tag(""), "text 0 is empty"),
    (lambda m: m["ner"].tag([]), "nothing to tag"),
    (lambda m: m["ner"].tag("hello", aggregation_strategy="longest"), "aggregation_strategy"),
    (lambda m: m["qa"].answer("", "hello world"), "question is empty"),
    (lambda m: m["qa"].answer("who", "  "), "context is empty"),
    (lambda m: m["qa"].answer("the " * 70, "hello world"), "more than max_question_len"),
    (lambda m: m["qa"].answer("the quick brown fox jumps", "hello world", max_seq_len=8), "leaves no room"),
    (lambda m: m["qa"].answer("who", "hello", doc_stride=30, max_seq_len=20), "doc_stride"),
    (lambda m: m["qa"].answer("who", "hello", max_seq_len=4096), "positions"),
    (lambda m: m["qa"].answer([("who", None)]), "context 0"),
    (lambda m: m["qa"].answer([]), "no questions"),
    (lambda m: m["ner"].answer("who", "hello"), "needs a question-answering model"),
    (lambda m: m["qa"].rerank("q", ["d"]), "needs a text-classification model"),
    (lambda m: m["cls"].rerank("q", ["d"]), "one output"),
])
def test_bad_task_inputs_are_one_line(zoo, call, message):
    models = {name: zoo.model(f"bert-{name}", "onnxruntime") for name in ("ner", "qa", "cls")}
    refused(lambda: call(models), message)


def test_rerank_refuses_empty_queries_and_documents(zoo, cross_encoder_case, tmp_path):
    from tests.zoo import build_checkpoint

    model = hotrod.load(build_checkpoint(cross_encoder_case, tmp_path / "ce"), backend="torch")
    for args, message in [(("", ["d"]), "query is empty"), (("q", []), "no documents"),
                          (("q", ["d", " "]), "document 1 is empty"), (("q", "d"), "list of texts")]:
        with pytest.raises(hotrod.HotrodError, match=message):
            model.rerank(*args)
    with pytest.raises(hotrod.HotrodError, match="top_n"):
        model.rerank("q", ["d"], top_n=0)


def _alike(ours, theirs) -> None:
    """The same nesting of lists and labels, the scores within 1e-4."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours["label"] == theirs["label"]
        assert abs(ours["score"] - theirs["score"]) <= 1e-4
        return
    assert isinstance(ours, list) and len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        _alike(a, b)


def test_classify_answers_in_the_pipelines_shapes(zoo):
    """top_k not given is the pipeline's legacy answer (a bare label for one pair); a number, even 1, lists."""
    model = zoo.model("bert-cls", "torch")
    pipe = transformers.pipeline("text-classification", model=zoo.reference("bert-cls"), tokenizer=model.tokenizer)
    pair = {"text": TEXTS[1], "text_pair": TEXTS[2]}
    for inputs in (TEXTS[0], TEXTS[:2], pair, [pair, pair]):
        for kwargs in ({}, {"top_k": 1}, {"top_k": 2}, {"top_k": None}):
            _alike(model.classify(inputs, **kwargs), pipe(inputs, **kwargs))


@pytest.mark.parametrize("top_k", [1, None])
@pytest.mark.parametrize("family", TEXT_CASES)
def test_classify_equals_the_text_classification_pipeline(zoo, family, top_k):
    model = zoo.model(f"{family}-cls", "onnxruntime")
    pipe = transformers.pipeline("text-classification", model=zoo.reference(f"{family}-cls"), tokenizer=model.tokenizer)
    for inputs in (TEXTS, [{"text": TEXTS[1], "text_pair": TEXTS[2]}, {"text": TEXTS[0], "text_pair": TEXTS[1]}]):
        ours, theirs = model.classify(inputs, top_k=top_k), pipe(inputs, top_k=top_k)
        for a, b in zip(ours, theirs, strict=True):
            for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b], strict=True):
                assert x["label"] == y["label"] and abs(x["score"] - y["score"]) <= 1e-4
