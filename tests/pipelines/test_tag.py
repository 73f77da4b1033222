"""`HotrodModel.tag` beyond the parity of `test_tasks`: labels kept or left out, long texts, slow
tokenizers (no offsets: no word strategies), and refusals, each one line."""

from __future__ import annotations

import pytest

from hotrod.pipelines.tag import groups
from tests.pipelines.test_tasks import TEXTS, refused


class Slow:
    """The zoo's fast tokenizer saying it is slow, as transformers' Python tokenizers do: no offsets."""

    is_fast = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        assert not kwargs.get("return_offsets_mapping")  # a slow tokenizer cannot give them
        return self.tokenizer(*args, **kwargs)


def test_labels_can_be_kept_or_named(zoo):
    model = zoo.model("bert-ner", "onnxruntime")
    every = model.tag(TEXTS[0], aggregation_strategy="none", ignore_labels=[])
    assert [e["index"] for e in every] == list(range(1, len(model.tokenizer(TEXTS[0])["input_ids"]) - 1))
    assert "O" in {e["entity"] for e in every}
    assert model.tag(TEXTS[0], aggregation_strategy="none", ignore_labels=None) == \
        [e for e in every if e["entity"] != "O"]
    left = {e["entity"] for e in every} - {"O"}
    some = left.pop()
    assert some not in {e["entity"] for e in model.tag(TEXTS[0], aggregation_strategy="none", ignore_labels=some)}


def test_the_default_aggregation_is_the_pipelines_every_token(zoo):
    model = zoo.model("bert-ner", "onnxruntime")
    every = model.tag(TEXTS[0], aggregation_strategy="none")
    assert model.tag(TEXTS[0]) == every == model.tag(TEXTS[0], aggregation_strategy=None)
    assert every and all("entity" in e and "index" in e for e in every)


def test_a_long_text_is_refused_or_cut(zoo):
    model = zoo.model("bert-ner", "torch")
    long = "the quick brown fox jumps over the lazy dog " * 10
    refused(lambda: model.tag(["fox", long]), "text 1 has .* tokens, more than the model's 64 positions")
    entities = model.tag(long, aggregation_strategy="none", ignore_labels=[], truncate=True)
    assert len(entities) == 62 and entities[-1]["end"] < len(long)  # 64 positions less [CLS] and [SEP]


@pytest.mark.parametrize("strategy", ["none", "simple"])
def test_a_slow_tokenizer_tags_without_characters(zoo, monkeypatch, strategy):
    model = zoo.model("bert-ner", "torch")
    fast = model.tag(TEXTS, aggregation_strategy=strategy)
    monkeypatch.setattr(model, "tokenizer", Slow(model.tokenizer))
    slow = model.tag(TEXTS, aggregation_strategy=strategy)
    assert slow == [[{**e, "start": None, "end": None} for e in entities] for entities in fast]


@pytest.mark.parametrize("strategy", ["first", "average", "max"])
def test_word_strategies_need_a_fast_tokenizer(zoo, monkeypatch, strategy):
    model = zoo.model("bert-ner", "torch")
    monkeypatch.setattr(model, "tokenizer", Slow(model.tokenizer))
    refused(lambda: model.tag(TEXTS, aggregation_strategy=strategy), f'"{strategy}" needs words, and this slow tokenizer')


def test_groups_join_as_the_simple_strategy():
    labels = ["B-PER", "I-PER", "B-PER", "O", "O", "I-LOC", "LOC", "I-PER"]
    assert groups(labels) == [[0, 1], [2], [3, 4], [5, 6], [7]]


BAD = {
    "not_text": (lambda m: m.tag(["fox", None]), "text 1 must be a string"),
    "not_a_list": (lambda m: m.tag(5), "texts must be a text or a list of texts, got int"),
    "unknown_strategy": (lambda m: m.tag("fox", aggregation_strategy="longest"), "aggregation_strategy"),
    "ignore_labels": (lambda m: m.tag("fox", ignore_labels=[0]), "ignore_labels must be a list of label names"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_tag_is_one_line(zoo, bad):
    call, message = BAD[bad]
    refused(lambda: call(zoo.model("bert-ner", "torch")), message)
