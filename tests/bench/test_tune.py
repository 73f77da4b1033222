"""`hotrod tune`: each of hotrod's CPU kernels an artifact uses timed with and without it, interleaved, and the
ones this machine runs faster without recorded as left out; the rule that chooses, the record it writes, and
the command's errors. Nothing here asserts which kernel is faster: that is the machine's to say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import hotrod
from hotrod.bench import tune
from hotrod.bench.tune import KernelTiming
from hotrod.cli import main
from hotrod.runtime import kernel_choice, native

library = pytest.mark.skipif(native.library() is None, reason="no kernels' library for this CPU: onnxruntime's ops run")


@pytest.fixture(scope="module")
def int8_bert(zoo, tmp_path_factory):
    return hotrod.optimize(zoo.checkpoint("bert"), tmp_path_factory.mktemp("bert-int8"), precision="int8",
                           progress=False, verify_examples=0)


@pytest.mark.parametrize(("lost", "speedup", "without_ms", "left_out"), [
    (15, 0.90, 9.0, True),    # slower with it in every round, by any measure
    (13, 0.90, 9.0, True),    # 13 of 15: p 0.0037
    (12, 0.90, 9.0, False),   # 12 of 15: p 0.018, what chance gives too often
    (15, 0.99, 9.0, False),   # within the margin: a tie stays
    (15, 0.90, 9.9, False),   # the medians tie
    (0, 1.30, 13.0, False),   # the kernel gains
])
def test_a_kernel_is_left_out_only_on_consistent_evidence(lost, speedup, without_ms, left_out):
    timing = KernelTiming("quantize-rows", 10.0, without_ms, speedup, lost, 15)
    assert timing.left_out is left_out
    assert timing.chance == pytest.approx(sum(math.comb(15, k) for k in range(lost, 16)) / 2 ** 15)


@pytest.mark.parametrize(("lost", "speedup", "without_ms", "decided"), [
    (15, 0.90, 9.0, True),    # a clear loss: left out
    (0, 1.30, 13.0, False),   # a clear win: run (put back where an earlier tune left it out)
    (2, 1.10, 11.0, False),   # 13 of 15 won
    (6, 1.05, 10.4, None),    # t5-small's int4 products on a Zen 4: no evidence, the earlier choice stays
    (0, 1.01, 10.1, None),    # won every round, within the margin
])
def test_only_evidence_changes_the_machines_choice(lost, speedup, without_ms, decided, monkeypatch, tmp_path):
    timing = KernelTiming("int4-matmul", 10.0, without_ms, speedup, lost, 15)
    assert timing.decided is decided
    monkeypatch.setattr(kernel_choice, "record_path", lambda: tmp_path / "record.json")
    kernel_choice.record({"int4-matmul": True}, {})
    _, chosen = kernel_choice.record({t.kernel: t.decided for t in [timing] if t.decided is not None}, {})
    assert ("int4-matmul" in chosen) is (decided is not False)


@library
def test_tune_times_each_kernel_the_artifact_uses_and_records_the_choice(int8_bert, capsys):
    kernel_choice.record({"int4-matmul": True}, {"int4-matmul": {"speedup": 0.9}})  # one this artifact cannot measure
    assert main(["tune", str(int8_bert), "--length", "8", "--runs", str(tune.MIN_RUNS), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    body = json.loads(kernel_choice.record_path().read_text())
    with kernel_choice.leaving_out(set()):
        every = hotrod.load(int8_bert, device="cpu", threads=1)
    used = kernel_choice.kernels_in(set().union(*every.backend.kernel_ops.values()))
    assert {"quantize-rows", "layernorm"} <= set(used) and set(body["measured"]) <= set(used) | {"int4-matmul"}
    assert "int4-matmul" in body["left_out"] and "int4-matmul" in body["measured"]  # kept: not measured here
    for name in used:  # the measurements that decided are kept, with the choice they made
        assert f"  {name} " in out
        if name not in body["measured"] or name == "int4-matmul":
            continue
        figures = body["measured"][name]
        timing = KernelTiming(name, figures["with_ms"], figures["without_ms"], figures["speedup"],
                              figures["rounds_faster_without"], figures["runs"])
        assert timing.decided is not None and (name in body["left_out"]) is timing.left_out
        assert figures["runs"] == tune.MIN_RUNS
        assert figures["threads"] == 1 and figures["artifact"] == str(Path(int8_bert).resolve())
    assert f"record: {kernel_choice.record_path()}" in out and "left out for this artifact: " in out


def test_tune_refuses_an_artifact_no_kernel_applies_to(zoo, capsys):
    assert main(["tune", str(zoo.artifact("bert")), "--length", "8"]) == 1  # fp32: none
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error:") and "none of hotrod's CPU kernels" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["tune"], ["tune", "--show", "--forget"], ["tune", "x", "--show"],
                                  ["tune", "x", "--forget"], ["tune", "x", "--runs", "0"], ["tune", "y", "--runs", "6"],
                                  ["tune", "--show", "--runs", "30"], ["tune", "--forget", "--batch", "1"],
                                  ["tune", "--show", "--threads", "0", "--length", "64"]])
def test_tune_errors_are_one_line(argv, tmp_path, capsys):
    argv = [str(tmp_path) if a == "x" else a for a in argv]  # "y": never read, the runs refused first
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error:") and len(err.splitlines()) == 1


def test_show_and_forget_refuse_the_work_options_they_would_ignore(capsys):
    assert main(["tune", "--show", "--runs", "30", "--new-tokens", "8"]) == 1
    assert "leave out --new-tokens, --runs" in capsys.readouterr().err


def test_show_and_forget(capsys):
    assert main(["tune", "--show"]) == 0
    assert "left out on this machine: none" in capsys.readouterr().out
    kernel_choice.record({"attention": True}, {})
    assert main(["tune", "--show"]) == 0
    assert "left out on this machine: attention" in capsys.readouterr().out
    assert main(["tune", "--forget"]) == 0 and "record removed" in capsys.readouterr().out
    assert main(["tune", "--forget"]) == 0 and "no record" in capsys.readouterr().out
    assert tune.MARGIN > 1.0 and 0.0 < tune.ALPHA < 0.5 and 0.5 ** tune.MIN_RUNS < tune.ALPHA <= 0.5 ** (tune.MIN_RUNS - 1)


def test_tune_and_profile_refuse_a_torch_engine_artifact(zoo, tmp_path, capsys):
    """The torch engine runs none of onnxruntime's graphs: both commands say so (tune raised an AttributeError)."""
    art = tmp_path / "engine"
    assert main(["optimize", str(zoo.checkpoint("gpt2")), "--out", str(art), "--backend", "torch"]) == 0
    capsys.readouterr()
    for command in (["tune", str(art), "--runs", "7"], ["profile", str(art), "--runs", "1"]):
        assert main([*command, "--length", "4", "--new-tokens", "2"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("hotrod: error:") and "torch engine artifact" in err and len(err.splitlines()) == 1
