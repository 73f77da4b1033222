"""`hotrod bench` on tiny models: figures present and sane, report written, missing peers skipped.

Nothing here asserts speed: the machines that run the tests are shared and noisy.
"""

from __future__ import annotations

import json

import pytest
import torch

from hotrod.bench import ct2, harness, peers
from hotrod.cli import main
from tests.zoo import TASK_HEADS


@pytest.fixture(autouse=True)
def every_test_settles_shortly(short_settle):
    """Each test here with the conftest's short pause."""


def sweep(zoo, name: str, out, *args: str) -> dict:
    """One small `hotrod bench` sweep on a zoo checkpoint; returns results.json."""
    tokens = [] if name == "bert" else ["--new-tokens", "2"]  # an encoder's sweep refuses --new-tokens
    argv = ["bench", str(zoo.checkpoint(name)), *tokens, "--runs", "2", "--out", str(out), *args]
    assert main(argv) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("name", ["gpt2", "t5", "bert"])
def test_sweep_writes_figures_and_report(zoo, tmp_path, capsys, no_floor_measurement, name):
    out = tmp_path / "bench"
    args = ["bench", str(zoo.checkpoint(name)), "--batch", "1,2", "--seq", "4,8",
            *([] if name == "bert" else ["--new-tokens", "2"]),
            "--precision", "fp32,int8", "--peers", "optimum,ctranslate2", "--runs", "2", "--out", str(out)]
    assert main(args) == 0
    assert "report:" in capsys.readouterr().out
    payload = json.loads((out / "results.json").read_text())
    assert payload["machine"]["cpu"] == "test" and len(payload["results"]) == 4
    for result in payload["results"]:
        assert set(result["systems"]) == {"pytorch", "hotrod fp32", "hotrod int8", "ctranslate2 fp32",
                                          "ctranslate2 int8"}
        assert set(result["skipped"]) == {"optimum"} and "environment of its own" in result["skipped"]["optimum"]
        for system in result["systems"].values():
            assert len(system["runs_s"]) == 2 and all(t > 0 for t in system["runs_s"])
            assert system["p50_s"] <= system["p90_s"] <= system["p99_s"]
            assert system["floor_s"] > 0 and system["times_floor"] > 0 and system["rss_bytes"] > 0
            if result["case"]["kind"] == "encoder":
                assert system["sequences_per_s"] > 0
            else:
                assert system["tokens_per_s"] > 0 and 0 < system["first_token_s"]
        assert result["systems"]["hotrod fp32"]["agreement"] > 0.999
        assert result["systems"]["ctranslate2 fp32"]["agreement"] > 0.999  # same weights, same ids, same answer
        for precision in ("fp32", "int8"):  # which of hotrod's CPU kernels ran, and none left out here
            hotrod_figures = result["systems"][f"hotrod {precision}"]
            assert isinstance(hotrod_figures["kernel_ops"], list) and hotrod_figures["kernels_left_out"] == []
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
    (["--batch", "0"], "--batch values must be within 1..256, got 0"),
    (["--batch", "1,257"], "--batch values must be within 1..256, got 257"),
    (["--precision", "fp8"], "unknown precision 'fp8'"),
    (["--peers", "tensorflow"], "unknown peer 'tensorflow'"),
    (["--workload", "W1"], "not both"),
    (["--runs", "0"], "--runs must be a whole number within 1..100, got 0"),
    (["--runs", "1000000000"], "--runs must be a whole number within 1..100"),
    (["--settle", "-1"], "--settle must be a number of seconds within 0..10, got -1.0"),
    (["--settle", "nan"], "--settle must be a number of seconds within 0..10, got nan"),
    (["--settle", "inf"], "--settle must be a number of seconds within 0..10, got inf"),
    (["--out", " "], "--out must name a folder"),
    (["--peers", "torch,infinity"], "--peers infinity times reranking (W7) only, and none of these cases reranks"),
    (["--precision", "fp32,int8,fp32"], "--precision names fp32 twice"),
    (["--batch", "1,2,1"], "--batch names 1 twice"),
])
def test_bad_bench_input_is_refused_before_any_run(zoo, tmp_path, capsys, no_floor_measurement, args, message):
    assert main(["bench", str(zoo.checkpoint("gpt2")), "--out", str(tmp_path / "b"), "--new-tokens", "2", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error:") and message in err and "\n" not in err
    assert not (tmp_path / "b" / "results.json").exists()


def test_unknown_workload_is_refused():
    with pytest.raises(harness.HotrodError, match="unknown workload 'W9'"):
        harness.workload_cases(["W9"])


def test_missing_peers_name_why_optimum_is_not_timed_here():
    skipped = harness.missing_peers(["torch", "optimum", "ctranslate2"])
    assert list(skipped) == ["optimum"] and skipped["optimum"]  # ctranslate2 and torch run


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_torch_compile_is_timed_or_skipped_with_its_reason(zoo, tmp_path, no_floor_measurement, name):
    payload = sweep(zoo, name, tmp_path / "b", "--batch", "2", "--seq", "4", "--peers", "torch")
    result = payload["results"][0]
    if "pytorch compiled" in result["skipped"]:  # no working compiler here: one line saying so
        assert result["skipped"]["pytorch compiled"] and "\n" not in result["skipped"]["pytorch compiled"]
    else:
        compiled = result["systems"]["pytorch compiled"]
        assert compiled["p50_s"] > 0 and compiled["agreement"] > 0.999


def test_torch_compile_without_a_compiler_is_skipped(zoo, tmp_path, no_floor_measurement, monkeypatch):
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    payload = sweep(zoo, "bert", tmp_path / "b", "--seq", "4", "--peers", "torch")
    result = payload["results"][0]
    assert "C++ compiler" in result["skipped"]["pytorch compiled"] and "pytorch compiled" not in result["systems"]


def test_a_peer_that_fails_is_skipped_and_the_run_goes_on(zoo, tmp_path, no_floor_measurement, monkeypatch):
    def broken(source, quantization):
        if quantization == "int8":
            raise ValueError("no int8 here\nsecond line")
        return real(source, quantization)

    real = ct2.convert
    monkeypatch.setattr(ct2, "convert", broken)
    payload = sweep(zoo, "t5", tmp_path / "b", "--seq", "4", "--peers", "ctranslate2")
    result = payload["results"][0]
    assert result["skipped"]["ctranslate2 int8"] == "ValueError: no int8 here"
    assert result["systems"]["ctranslate2 fp32"]["agreement"] > 0.999


def test_ctranslate2_converts_once_and_maps_ids_through_its_vocabulary(zoo):
    source = str(zoo.checkpoint("gpt2"))
    first = ct2.convert(source, "float32")
    stamp = (first / "model.bin").stat().st_mtime_ns
    assert ct2.convert(source, "float32") == first and (first / "model.bin").stat().st_mtime_ns == stamp
    tokens = ct2.vocabulary(first)
    assert len(tokens) == 100 and tokens[7] == "<7>"


def test_cuda_without_a_gpu_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(harness, "workload_cases", lambda ids: pytest.fail("workloads built before the check"))
    assert main(["bench", "--workload", "W1", "--device", "cuda", "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error: --device cuda") and "no CUDA device" in err and "\n" not in err
    assert not (tmp_path / "b").exists()


def test_report_shows_device_memory_when_measured(tmp_path):
    from hotrod.bench.report import write_report

    figures = {"p50_s": 0.01, "p90_s": 0.01, "p99_s": 0.01, "speedup": 1.0, "times_floor": 2.0,
               "sequences_per_s": 100.0, "agreement": 1.0, "size_bytes": 10**6, "rss_bytes": 10**8,
               "gpu_memory_bytes": 3 * 10**8}
    result = harness.Result(case={"name": "c", "kind": "encoder", "lengths": [4], "new_tokens": 0, "device": "cuda"},
                            systems={"pytorch": figures}, skipped={"ctranslate2": "no | CUDA"})
    report = write_report([result], tmp_path).read_text()
    assert "on cuda" in report and "| GPU MB |" in report and "| 300 |" in report
    skipped_row = next(line for line in report.splitlines() if line.startswith("| ctranslate2 "))
    assert skipped_row.count("|") == report.splitlines()[6].count("|")  # as many cells as the header


@pytest.mark.parametrize("args, message", [
    (["--batch", "two"], "argument --batch: expects comma-separated integers, got 'two'"),
    (["--seq", ","], "argument --seq: expects a comma-separated list, got an empty one"),
    (["--peers", ""], "argument --peers: expects a comma-separated list, got an empty one"),
])
def test_a_malformed_list_is_a_command_line_error(zoo, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", str(zoo.checkpoint("gpt2")), "--out", str(tmp_path / "b"), *args])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("hotrod: error:") and message in err and "\n" not in err


@pytest.mark.parametrize("head", sorted(TASK_HEADS))
def test_every_head_task_runs_both_sides_and_agrees(zoo, head):
    """Each head task the bench times has its `TaskSpec.bench` (transformers' class, the answer, the agreement):
    hotrod's and PyTorch's answers agree fully at fp32, so a task without one fails here, not in a peer run."""
    from hotrod import load
    from hotrod.bench.case import Case
    from hotrod.bench.runners import agreement, hotrod_runner, pytorch_model, pytorch_runner

    task = TASK_HEADS[head][0]
    case = Case(f"bert-{head}", str(zoo.checkpoint(f"bert-{head}")), "encoder", (9, 7), task=task)
    reference = pytorch_model(case.source, case.kind, task=task)
    ids, mask = case.inputs(reference.config.vocab_size)
    theirs = pytorch_runner(reference, case.kind, ids, mask, task=task)()
    ours = hotrod_runner(load(case.source, backend="torch"), ids, mask, task=task)()
    assert agreement(ours, theirs, case.kind, mask, task) == pytest.approx(1.0)


def test_what_a_sweep_or_a_workload_does_not_take_is_refused(zoo, tmp_path, capsys, no_floor_measurement):
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv, message in [
        (["--workload", "W3", "--batch", "2"], "--batch applies to a model's sweep; a workload has its own shapes"),
        (["--workload", "W3", "--new-tokens", "5"], "--new-tokens applies to a model's sweep"),
        (["--workload", "W1,W99"], "unknown workload 'W99'"),  # before W1's checkpoint is built
        ([str(zoo.checkpoint("bert")), "--new-tokens", "7"], "--new-tokens applies to language models"),
        ([str(zoo.checkpoint("bert")), "--out", str(afile)], f"--out {afile} is a file, not a folder"),
    ]:
        capsys.readouterr()  # the checkpoint's build (its progress bar) is no part of the answer
        assert main(["bench", *argv, "--out", str(tmp_path / "b")] if "--out" not in argv else ["bench", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("hotrod: error:") and message in err and "\n" not in err, (argv, err)
    assert not (tmp_path / "b").exists()


def test_a_head_checkpoints_sweep_runs_its_head(zoo, tmp_path, no_floor_measurement):
    out = tmp_path / "bench"
    assert main(["bench", str(zoo.checkpoint("bert-cls")), "--runs", "1", "--seq", "6", "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())["results"][0]
    assert result["case"]["task"] == "text-classification"
    assert result["systems"]["hotrod fp32"]["agreement"] == 1.0  # the labels compared, as the head's bench says


def test_a_run_cut_short_says_so_and_leaves_no_earlier_report(zoo, tmp_path, no_floor_measurement, monkeypatch):
    out = tmp_path / "bench"
    whole = sweep(zoo, "bert", out, "--seq", "4,6")
    assert whole["planned"] == ["b1-s4", "b1-s6"] and whole["complete"] and (out / "report.md").exists()
    real = harness._run_case

    def cut(case, plan, result):
        if case.name == "b1-s6":
            raise KeyboardInterrupt
        real(case, plan, result)

    monkeypatch.setattr(harness, "_run_case", cut)
    with pytest.raises(KeyboardInterrupt):
        harness.run(harness.sweep_cases(str(zoo.checkpoint("bert")), [1], [4, 6], None), ["fp32"], [], 1, 1, out)
    cut_short = json.loads((out / "results.json").read_text())
    assert cut_short["planned"] == ["b1-s4", "b1-s6"] and not cut_short["complete"]
    assert len(cut_short["results"]) == 1
    assert not (out / "report.md").exists() and not (out / "speedup.png").exists()


@pytest.mark.parametrize("samples, q, expected", [
    (range(1, 7), 90, 6), (range(1, 11), 90, 9), (range(1, 6), 50, 3), (range(1, 27), 90, 24), ([7.0], 99, 7.0),
])
def test_percentiles_are_nearest_rank(samples, q, expected):
    assert harness._percentile(list(samples), q) == expected


def test_settle_is_the_idle_time_before_each_timed_run_and_is_recorded(zoo, tmp_path, no_floor_measurement,
                                                                         monkeypatch):
    pauses, real = [], harness.interleaved

    def spy(systems, runs, warmup=1, settle=harness.SETTLE_S):
        pauses.append(settle)
        return real(systems, runs=runs, warmup=warmup, settle=settle)

    monkeypatch.setattr(harness, "interleaved", spy)
    result = sweep(zoo, "bert", tmp_path / "b", "--seq", "4", "--settle", "0")
    assert pauses and set(pauses) == {0.0} and result["settle_s"] == 0.0
    pauses.clear()
    assert sweep(zoo, "bert", tmp_path / "c", "--seq", "4")["settle_s"] == harness.SETTLE_S
    assert pauses and set(pauses) == {harness.SETTLE_S}
