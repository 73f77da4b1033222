"""benchmarks/serve_embeddings.py (W9) at its --tiny size on `hotrod serve` alone (the peers run in
environments of their own, and the full run is a benchmark's job): every answer of the openai client has a
vector per text, and the results name hotrod's texts per second. Bad settings are one line before any work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import serve_embeddings  # noqa: E402

from hotrod.errors import HotrodError  # noqa: E402


def test_tiny_run_of_hotrod_serve(tmp_path, monkeypatch):
    pytest.importorskip("openai")
    pytest.importorskip("sentence_transformers")
    for name in ("HOTROD_INFINITY_PYTHON", "HOTROD_OPENVINO_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "w9"
    assert serve_embeddings.main(["--tiny", "--systems", "hotrod", "--requests", "4", "--concurrency", "2",
                                  "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    width = serve_embeddings.w9_config(tiny=True).hidden_size
    [cell] = data["cells"]
    assert cell["system"] == "hotrod serve int8" and cell["where"] == "served", data["problems"]
    assert cell["completed"] == 4 and cell["failed"] == 0, cell["errors"]
    assert cell["shapes"] == [f"{serve_embeddings.TEXTS}x{width}"]  # every answer: 32 vectors of the width
    assert cell["texts_per_s"] > 0 and cell["p50_s"] > 0
    assert cell["cosine_to_st_fp32"]["min"] > 0.99  # the served pipeline is the checkpoint's (CLS, Normalize)
    assert "| hotrod serve int8 | served | 2 | 4 / 0 |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "0"], "must be >= 1"),
    (["--systems", "hotrod,tei"], "--systems: tei"),
    (["--st-backends", "onnx-O4"], "--st-backends: onnx-O4"),
])
def test_bad_settings_are_refused_before_any_work(args, message, capsys, monkeypatch):
    monkeypatch.setattr(serve_embeddings, "run", lambda args: pytest.fail("ran"))
    with pytest.raises(SystemExit):
        serve_embeddings.main(args)
    assert message in capsys.readouterr().err


def test_an_unknown_precision_is_one_line(monkeypatch):
    monkeypatch.setattr(serve_embeddings, "run", lambda args: pytest.fail("ran"))
    with pytest.raises(HotrodError, match="precision"):
        serve_embeddings.main(["--precision", "int8,int3"])
