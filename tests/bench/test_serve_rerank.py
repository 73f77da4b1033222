"""benchmarks/serve_rerank.py's own checks (the full run starts two servers on a 22M-parameter model, a
benchmark's job, not the suite's): bad settings are one line before any work, and the report's table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import serve_rerank  # noqa: E402

from hotrod.errors import HotrodError  # noqa: E402


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "0"], "--concurrency values must be >= 1"),
    (["--concurrency", "a"], "comma-separated integers"),
    (["--requests", "0"], "--requests and --threads must be >= 1"),
])
def test_bad_settings_are_refused_before_any_work(args, message, capsys, monkeypatch):
    monkeypatch.setattr(serve_rerank, "run", lambda args: pytest.fail("ran"))
    with pytest.raises(SystemExit):
        serve_rerank.main(args)
    assert message in capsys.readouterr().err


def test_an_unknown_precision_is_one_line(monkeypatch):
    monkeypatch.setattr(serve_rerank, "run", lambda args: pytest.fail("ran"))
    with pytest.raises(HotrodError, match="precision"):
        serve_rerank.main(["--precision", "int3"])


def test_the_report_has_a_row_per_cell():
    cell = {"server": "hotrod int8", "concurrency": 4, "completed": 24, "failed": 0, "requests_per_s": 1.3,
            "p50_s": 0.75, "p90_s": 0.81}
    text = serve_rerank.report({"machine": "m", "settings": {}, "cells": [cell, {**cell, "server": "infinity"}]})
    assert "| hotrod int8 | 4 | 24 / 0 | 1.30 | 0.750 | 0.810 |" in text and "| infinity | 4 |" in text
    failed = {**cell, "completed": 0, "failed": 24, "requests_per_s": 0.0, "p50_s": None, "p90_s": None}
    text = serve_rerank.report({"machine": "m", "settings": {}, "cells": [failed], "problems": ["x: exited"]})
    assert "| 0 / 24 | 0.00 | - | - |" in text and "Not measured: x: exited" in text


def test_a_rerank_answer_gives_one_score_per_result():
    import httpx

    response = httpx.Response(200, json={"results": [{"index": 1, "relevance_score": 0.5},
                                                     {"index": 0, "relevance_score": -1}]},
                              request=httpx.Request("POST", "http://x"))
    assert serve_rerank.scores(response) == [0.5, -1.0]
