"""Verification: figures against the source, recorded by optimize, reported by `hotrod verify`."""

from __future__ import annotations

import json

import pytest

import hotrod
from hotrod.cli import main
from hotrod.errors import HotrodError
from hotrod.verification.compare import Example, read_examples
from tests.zoo import ALL_CASES, VERIFY_EXAMPLES

LM_FIGURES = {"logits_max_abs", "logits_cosine", "token_agreement", "exact_match", "score"}
ENCODER_FIGURES = {"hidden_max_abs", "hidden_cosine", "embedding_cosine", "score"}


def test_optimize_records_verification_figures(zoo, case):
    manifest = json.loads((zoo.artifact(case) / "manifest.json").read_text())
    figures = manifest["verification"]
    assert figures["examples"] == VERIFY_EXAMPLES and figures["examples_from"] == "built-in texts"
    assert (ENCODER_FIGURES if manifest["kind"] == "encoder" else LM_FIGURES) <= set(figures)
    assert figures["score"] > 0.999  # fp32 graphs give the source's answers
    if manifest["kind"] != "encoder":
        assert figures["exact_match"] == 1.0 and figures["logits_max_abs"] < max(1e-3, ALL_CASES[case].atol)


def test_verify_api_against_the_recorded_source(zoo, lm_case):
    figures = hotrod.verify(zoo.artifact(lm_case), examples=3)
    assert figures["examples"] == 3 and figures["exact_match"] == 1.0
    assert figures["logits_cosine"] > 0.9999


def test_task_exact_match_from_targets(zoo, tmp_path):
    """Targets turn on task exact match; the source's own score is reported beside the artifact's."""
    model = zoo.model("gpt2", "onnxruntime")
    prompt = "hello world"
    ids = model.tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    target = model.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
    file = tmp_path / "examples.tsv"
    file.write_text(f"{prompt}\t{target}\n{prompt}\tsurely not this\n")
    figures = hotrod.verify(zoo.artifact("gpt2"), texts=file, max_new_tokens=4)
    assert figures["task_exact_match"] == figures["source_task_exact_match"] == 0.5
    assert figures["score_name"] == "task exact match"


def test_read_examples_splits_targets(tmp_path):
    file = tmp_path / "ex.tsv"
    file.write_text("a b\tc\nd e\n")
    assert read_examples(file) == [Example("a b", "c"), Example("d e", None)]


def test_skipping_verification_is_recorded(zoo, tmp_path, capsys):
    out = hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "a", verify_examples=0, progress=False)
    assert json.loads((out / "manifest.json").read_text())["verification"] is None
    assert main(["info", str(out)]) == 0
    assert "verified    no" in capsys.readouterr().out


def test_verify_cli_prints_figures(zoo, capsys):
    assert main(["verify", str(zoo.artifact("bert")), "--examples", "2"]) == 0
    assert "embedding_cosine" in capsys.readouterr().out
    assert main(["verify", str(zoo.artifact("t5")), "--examples", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 2


def test_verify_against_another_checkpoint(zoo):
    figures = hotrod.verify(zoo.artifact("t5"), against=zoo.checkpoint("t5"), examples=2)
    assert figures["against"] == str(zoo.checkpoint("t5"))


@pytest.mark.parametrize("mistake", ["not_artifact", "other_model", "zero_examples", "bad_texts"])
def test_verify_bad_input_is_one_clear_error(zoo, tmp_path, capsys, mistake):
    args = {
        "not_artifact": [str(zoo.checkpoint("bert"))],
        "other_model": [str(zoo.artifact("bert")), "--against", str(zoo.checkpoint("t5"))],
        "zero_examples": [str(zoo.artifact("bert")), "--examples", "0"],
        "bad_texts": [str(zoo.artifact("bert")), "--texts", str(tmp_path / "missing.txt")],
    }[mistake]
    assert main(["verify", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error:") and "\n" not in err


def test_optimize_rejects_bad_calibration_before_any_work(zoo, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(HotrodError, match="no text"):
        hotrod.optimize(zoo.checkpoint("gpt2"), tmp_path / "out", precision="int8-static", calibration=empty)
    assert not (tmp_path / "out").exists()
