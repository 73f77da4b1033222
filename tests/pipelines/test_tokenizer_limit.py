"""A tokenizer whose model_max_length is below the model's positions: where the reference cuts there
(sentence-transformers' Transformer for any checkpoint, transformers' token-classification pipeline), hotrod
cuts there too, or refuses a longer text; never runs it whole and answers otherwise."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import hotrod
from tests.pipelines.test_tasks import _close, refused
from tests.zoo import HEAD_CASES, build_checkpoint, load_on

LONG = "the quick brown fox jumps over the lazy dog says a tiny model to the whole world hello"
LIMIT = 16


def _limited(source):
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": LIMIT}))
    return source


def test_a_plain_checkpoint_embeds_as_sentence_transformers_cuts(zoo, tmp_path, backend):
    st = pytest.importorskip("sentence_transformers")
    source = _limited(zoo.copy_checkpoint("bert", tmp_path / "bert16"))
    reference = st.SentenceTransformer(str(source), device="cpu")
    assert reference.max_seq_length == LIMIT
    expected = reference.encode(["hello world", LONG], convert_to_tensor=True)
    torch.testing.assert_close(load_on(source, backend).embed(["hello world", LONG]), expected,
                               atol=1e-5, rtol=0)


def test_tagging_refuses_or_cuts_where_the_pipeline_cuts(tmp_path):
    source = _limited(build_checkpoint(HEAD_CASES["bert-ner"], tmp_path / "ner16"))
    model = hotrod.load(source, backend="torch")
    refused(lambda: model.tag(LONG), "text 0 has .* tokens, more than the 16 tokens its tokenizer takes")
    pipe = transformers.pipeline("token-classification", model=str(source), aggregation_strategy="none")
    theirs = pipe(LONG, ignore_labels=[])
    ours = model.tag(LONG, truncate=True, aggregation_strategy="none", ignore_labels=[])
    assert len(theirs) == LIMIT - 2  # the pipeline cut the text: the tokens between [CLS] and [SEP]
    _close(ours, theirs)
