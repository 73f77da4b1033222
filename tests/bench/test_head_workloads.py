"""W6 (question answering) and W7 (reranking) through the harness, at tiny sizes: the definitions run, every
system answers like PyTorch, and the peers that cannot run a case are skipped with a one-line reason."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hotrod.bench import harness, infinity_peer, openvino_peer, workloads
from hotrod.cli import main
from hotrod.tasks.answer import best_spans, span_f1

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 120, "max_position_embeddings": 64, "initializer_range": 0.5}  # scores far apart: ranks are stable


def _tiny_qa():
    from transformers import BertConfig, BertForQuestionAnswering

    return BertForQuestionAnswering(BertConfig(**TINY))


def _tiny_cross_encoder():
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(**TINY, num_labels=1))


@pytest.fixture
def tiny_workloads(monkeypatch, tmp_path, no_floor_measurement, short_settle):
    """W6 and W7 as defined, on tiny models and rows, with their checkpoints under a fresh cache."""
    monkeypatch.setenv("HOTROD_CACHE", str(tmp_path / "cache"))
    w6, w7 = workloads.WORKLOADS["W6"], workloads.WORKLOADS["W7"]
    tiny = {
        "W6": dataclasses.replace(w6, build=_tiny_qa, lengths=(24,), batches=(1, 3)),
        "W7": dataclasses.replace(w7, build=_tiny_cross_encoder, lengths=(9, 14, 11, 20, 12), query=3),
    }
    monkeypatch.setattr(harness, "WORKLOADS", {**workloads.WORKLOADS, **tiny})


def run_bench(tmp_path, workload: str, peers: str, precisions: str = "fp32,int8") -> list[dict]:
    """`hotrod bench` on one workload at one thread and one run: its results."""
    out = tmp_path / "bench"
    argv = ["bench", "--workload", workload, "--precision", precisions, "--peers", peers, "--runs", "1",
            "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    return json.loads((out / "results.json").read_text())["results"]


def test_w6_answers_questions_at_each_batch(tiny_workloads, tmp_path):
    results = run_bench(tmp_path, "W6", "ctranslate2")
    assert [r["case"]["name"] for r in results] == ["W6-b1", "W6-b3"]
    for result in results:
        assert result["case"]["task"] == "question-answering" and len(result["case"]["lengths"]) in (1, 3)
        assert {"pytorch", "hotrod fp32", "hotrod int8"} <= set(result["systems"])
        assert result["systems"]["hotrod fp32"]["agreement"] == 1.0  # answer F1 against PyTorch's spans
        assert 0.0 <= result["systems"]["hotrod int8"]["agreement"] <= 1.0
        for reason in result["skipped"].values():
            assert reason and "\n" not in reason
        assert "not a question-answering head" in result["skipped"]["ctranslate2"]


_OPENVINO = openvino_peer.problem("cpu")


@pytest.mark.skipif(_OPENVINO is not None, reason=f"OpenVINO's environment is not here: {_OPENVINO}")
@pytest.mark.parametrize("workload", ["W6", "W7"])
def test_openvino_runs_the_heads_as_pytorch(tiny_workloads, tmp_path, workload):
    """OpenVINO runs W6 as optimum-intel's question-answering model, through the same span search, and W7's
    pairs (with their token types) as its sequence classifier: at fp32 its answers are PyTorch's (answer F1,
    rank agreement), at every batch, and its int8 paths answer too."""
    results = run_bench(tmp_path, workload, "openvino", precisions="fp32")
    for result in results:
        systems = result["systems"]
        assert {"openvino fp32", "openvino int8", "openvino int8-full"} <= set(systems), result["skipped"]
        assert systems["openvino fp32"]["agreement"] == 1.0
        assert all(0.0 <= systems[name]["agreement"] <= 1.0 for name in ("openvino int8", "openvino int8-full"))
        assert systems["openvino fp32"]["version"] and systems["openvino fp32"]["sequences_per_s"] > 0


def test_w7_reranks_with_hotrod_and_cross_encoder(tiny_workloads, tmp_path):
    pytest.importorskip("sentence_transformers")
    [result] = run_bench(tmp_path, "W7", "crossencoder,infinity")
    systems = result["systems"]
    assert {"pytorch", "hotrod fp32", "hotrod int8", "crossencoder"} <= set(systems)
    assert systems["hotrod fp32"]["agreement"] == 1.0 and systems["crossencoder"]["agreement"] == 1.0
    assert systems["hotrod fp32"]["sequences_per_s"] > 0
    if "infinity" in result["skipped"]:
        assert "\n" not in result["skipped"]["infinity"]


@pytest.mark.skipif(infinity_peer.problem("cpu") is not None, reason="Infinity's environment is not here (make peers)")
def test_w7_times_infinity_in_its_own_environment(tiny_workloads, tmp_path):
    [result] = run_bench(tmp_path, "W7", "infinity")
    infinity = result["systems"]["infinity"]
    assert infinity["agreement"] == 1.0 and infinity["sequences_per_s"] > 0
    assert infinity["version"]


def test_rerankers_skip_other_workloads_with_a_reason(tiny_workloads, tmp_path, capsys):
    """Beside W7 a reranker is skipped on the other workloads, with its reason; with none that reranks, it is
    refused before anything is built."""
    pytest.importorskip("sentence_transformers")
    results = run_bench(tmp_path, "W6,W7", "crossencoder")
    assert all(r["skipped"]["crossencoder"] == "crossencoder times cross-encoder reranking only (W7)"
               for r in results if not r["case"]["query"])
    assert any(not r["case"]["query"] for r in results)
    assert any("crossencoder" in r["systems"] for r in results if r["case"]["query"])
    assert main(["bench", "--workload", "W6", "--peers", "crossencoder", "--out", str(tmp_path / "b")]) == 1
    assert "--peers crossencoder times reranking (W7) only" in capsys.readouterr().err


def test_w7_rows_come_back_as_the_same_text(tiny_workloads):
    from transformers import AutoTokenizer

    from hotrod.bench.vocab import texts

    [case] = harness.workload_cases(["W7"])
    ids, mask = case.inputs(TINY["vocab_size"])
    query, documents = texts(ids, mask, case.query)
    tokenizer = AutoTokenizer.from_pretrained(case.source)
    encoded = tokenizer([query] * len(documents), documents, padding=True, return_tensors="pt")
    assert torch.equal(encoded["input_ids"], ids) and torch.equal(encoded["token_type_ids"], case.token_types(mask))


def test_span_search_keeps_answers_short_and_on_real_tokens():
    start = torch.tensor([[0.0, 5.0, 0.0, 0.0, 9.0]])
    end = torch.tensor([[0.0, 0.0, 4.0, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert best_spans(start, end, mask).tolist() == [[1, 2]]
    assert best_spans(start, end, mask, longest=1).tolist() == [[1, 1]]
    assert span_f1(torch.tensor([[1, 2]]), torch.tensor([[2, 3]])) == 0.5


def test_full_size_definitions():
    w6, w7 = workloads.WORKLOADS["W6"], workloads.WORKLOADS["W7"]
    assert w6.lengths == (384,) and w6.batches == (1, 8) and w6.head == "question-answering"
    assert len(w7.lengths) == 100 and w7.head == "text-classification"
    assert all(32 <= n - w7.query - 3 <= 128 for n in w7.lengths)


def test_a_workload_checkpoint_cut_short_is_built_again(tiny_workloads, tmp_path):
    """transformers writes config.json before the weights: a build interrupted between them left a folder
    that every later run failed to read; now builds go to a folder beside it, renamed into place whole."""
    root = tmp_path / "cache" / "bench" / "checkpoints"
    (root / "W6").mkdir(parents=True)
    (root / "W6" / "config.json").write_text("{}")  # what an interrupted save leaves
    path = workloads.checkpoint(harness.WORKLOADS["W6"], root)
    assert path == root / "W6" and any(path.glob("*.safetensors"))
    assert [p.name for p in root.iterdir()] == ["W6"]  # no partial folder left beside it
    assert workloads.checkpoint(harness.WORKLOADS["W6"], root) == path  # built once
