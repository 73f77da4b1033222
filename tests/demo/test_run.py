"""`hotrod demo` end to end on the smallest built-in model: auto, verification, timing, report."""

from __future__ import annotations

import json

import pytest

from hotrod.cli import main
from hotrod.demo import run as demo


@pytest.fixture
def quick_demo(monkeypatch):
    monkeypatch.setattr(demo, "VERIFY_EXAMPLES", 12)
    monkeypatch.setattr(demo, "TIMED_PROMPTS", 2)


def test_demo_optimizes_verifies_times_and_reports(quick_demo, tmp_path, capsys):
    assert main(["demo", "--models", "gpt2-numbers", "--runs", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gpt2-numbers" in out and "speedup" in out
    report = tmp_path / "report" / "report.md"
    assert f"report: {report}" in out
    text = report.read_text()
    assert "| gpt2-numbers |" in text and "Candidates" in text and "speedup.png" in text
    png = (tmp_path / "report" / "speedup.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    [result] = json.loads((tmp_path / "report" / "report.json").read_text())
    assert result["pytorch_s"] > 0 and result["hotrod_s"] > 0
    assert result["accuracy"]["measure"] == "held-out exact match"
    assert result["accuracy"]["pytorch"] >= 0.95 and result["accuracy"]["hotrod"] >= 0.94
    manifest = json.loads((tmp_path / "gpt2-numbers-auto" / "manifest.json").read_text())
    assert manifest["auto"]["chosen"] == result["precision"]


def test_demo_reuses_an_unchanged_artifact(quick_demo, tmp_path):
    from hotrod.demo.models import demo_model

    model = demo_model("gpt2-numbers")
    first = demo.demo_artifact(model, tmp_path, 0.01, progress=False)
    stamp = (first / "manifest.json").stat().st_mtime_ns
    again = demo.demo_artifact(model, tmp_path, 0.01, progress=False)
    assert (again / "manifest.json").stat().st_mtime_ns == stamp
    demo.demo_artifact(model, tmp_path, 0.05, progress=False)  # another budget is another build
    assert (first / "manifest.json").stat().st_mtime_ns != stamp


def test_demo_unknown_model_is_one_clear_error(capsys):
    assert main(["demo", "--models", "nope"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error: unknown demo model 'nope'") and "\n" not in err
