"""`hotrod bench` on tiny models: figures present and sane, report written, missing peers skipped.

Nothing here asserts speed: the machines that run the tests are shared and noisy.
"""

from __future__ import annotations

import json

import pytest

from hotrod.bench import harness
from hotrod.cli import main


@pytest.fixture
def no_floor_measurement(monkeypatch):
    """The machine's figures are measured once per machine; the tests use fixed ones."""
    from hotrod.bench.floor import Machine

    fixed = Machine(cpu="test", threads=1, bandwidth_gbs=10.0, matmul_gflops=50.0, int8_gops=100.0, measured="-")
    monkeypatch.setattr(harness, "machine", lambda threads: fixed)


@pytest.mark.parametrize("name", ["gpt2", "t5", "bert"])
def test_sweep_writes_figures_and_report(zoo, tmp_path, capsys, no_floor_measurement, name):
    out = tmp_path / "bench"
    args = ["bench", str(zoo.checkpoint(name)), "--batch", "1,2", "--seq", "4,8", "--new-tokens", "2",
            "--precision", "fp32,int8", "--peers", "torch,optimum,ctranslate2", "--runs", "2", "--out", str(out)]
    assert main(args) == 0
    assert "report:" in capsys.readouterr().out
    payload = json.loads((out / "results.json").read_text())
    assert payload["machine"]["cpu"] == "test" and len(payload["results"]) == 4
    for result in payload["results"]:
        assert set(result["systems"]) == {"pytorch", "hotrod fp32", "hotrod int8"}
        assert set(result["skipped"]) == {"optimum", "ctranslate2"}  # each with its reason
        for system in result["systems"].values():
            assert len(system["runs_s"]) == 2 and all(t > 0 for t in system["runs_s"])
            assert system["p50_s"] <= system["p90_s"] <= system["p99_s"]
            assert system["floor_s"] > 0 and system["times_floor"] > 0 and system["rss_bytes"] > 0
            if result["case"]["kind"] == "encoder":
                assert system["sequences_per_s"] > 0
            else:
                assert system["tokens_per_s"] > 0 and 0 < system["first_token_s"]
        assert result["systems"]["hotrod fp32"]["agreement"] > 0.999
    report = (out / "report.md").read_text()
    assert "| hotrod int8 |" in report and "x floor" in report
    for chart in ("speedup.png", "latency_vs_batch.png", "latency_vs_seq.png"):
        assert (out / chart).read_bytes().startswith(b"\x89PNG")


def test_missing_peer_is_skipped_with_its_reason(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "ctranslate2" else real(name))
    skipped = harness.missing_peers(["torch", "ctranslate2"])
    assert list(skipped) == ["ctranslate2"] and "not installed" in skipped["ctranslate2"]


@pytest.mark.parametrize("args, message", [
    (["--seq", "200"], "longer than the model's 64 positions"),
    (["--batch", "0"], "--batch values must be >= 1"),
    (["--batch", "two"], "--batch expects comma-separated integers"),
    (["--precision", "fp8"], "unknown precision 'fp8'"),
    (["--peers", "tensorflow"], "unknown peer 'tensorflow'"),
    (["--workload", "W1"], "not both"),
    (["--runs", "0"], "--runs must be >= 1"),
])
def test_bad_bench_input_is_refused_before_any_run(zoo, tmp_path, capsys, no_floor_measurement, args, message):
    assert main(["bench", str(zoo.checkpoint("gpt2")), "--out", str(tmp_path / "b"), "--new-tokens", "2", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error:") and message in err and "\n" not in err
    assert not (tmp_path / "b" / "results.json").exists()


def test_unknown_workload_is_refused():
    with pytest.raises(harness.HotrodError, match="unknown workload 'W9'"):
        harness.workload_cases(["W9"])
