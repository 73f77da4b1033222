"""The GPU session's scripts, checked where CI runs (no GPU): a lent GPU's minutes are too few to spend on a
script that breaks. `gpu_engine.py --smoke` runs its tiny shapes on the CPU end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_engine  # noqa: E402
import gpu_profile  # noqa: E402


def test_the_engine_benchmark_runs_its_smoke_shapes_and_writes_its_summary(tmp_path):
    assert gpu_engine.main(["--smoke", "--workloads", "G1,G4", "--runs", "1", "--peers", "",
                            "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"  # the script takes a GPU there is
    assert set(summary["workloads"]) == {"G1", "G4"} and summary["device"] == device
    results = {r["workload"]: r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    assert results["G1"]["checks"]["fp32_tokens_identical"] is True and not results["G1"]["notes"]
    assert results["G4"]["checks"]["hidden_cosine_vs_hf_half"] > 0.999 and results["G4"]["hotrod_s"] > 0
    assert "| G4 |" in (tmp_path / "report.md").read_text()


def test_the_engine_benchmark_refuses_an_unknown_workload_or_peer(capsys):
    for args in (["--workloads", "G9"], ["--peers", "G1,G7"]):
        with pytest.raises(SystemExit):
            gpu_engine.main(["--smoke", *args])
        assert "unknown workload(s) G" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU does")
def test_the_profiler_needs_a_gpu(capsys):
    with pytest.raises(SystemExit):
        gpu_profile.main(["--workloads", "G1"])
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [(["--workloads", "G1,G8"], "unknown workload(s) G8"),
                                           (["--precision", "int4"], "invalid choice: 'int4'")])
def test_the_profiler_refuses_a_bad_workload_or_precision(args, message, capsys):
    with pytest.raises(SystemExit):
        gpu_profile.main(args)
    assert message in capsys.readouterr().err


def test_the_session_script_parses():
    assert subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu.sh")]).returncode == 0
