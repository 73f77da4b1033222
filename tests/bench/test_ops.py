"""`hotrod profile`: per-operator kernel time per run from onnxruntime's profiler, beside each graph's floor.

Nothing here asserts speed; the figures are checked for what they must be whatever the machine.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hotrod
from hotrod.bench import ops
from hotrod.cli import main
from hotrod.errors import HotrodError


@pytest.fixture
def fixed_machine(monkeypatch):
    from hotrod.bench.floor import Machine

    fixed = Machine(cpu="test", threads=1, bandwidth_gbs=10.0, matmul_gflops=50.0, int8_gops=100.0, measured="-")
    monkeypatch.setattr(ops, "machine", lambda threads: fixed)
    return fixed


def _event(cat: str, name: str, ts: float, dur: float, op: str | None = None) -> dict:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, **({"args": {"op_name": op}} if op else {})}


def test_op_times_sums_each_operator_per_run_after_the_warm_up():
    trace = [
        _event("Session", "model_run", 0, 900),  # the warm-up, before the mark
        _event("Node", "a_kernel_time", 10, 500, "MatMul"),
        _event("Session", "model_run", 1000, 100),
        _event("Node", "a_kernel_time", 1010, 40, "MatMul"),
        _event("Node", "b_kernel_time", 1050, 20, "MatMul"),
        _event("Node", "b_fence_before", 1049, 5, "MatMul"),  # not a kernel's time
        _event("Node", "c_kernel_time", 1070, 10, "Add"),
        _event("Session", "model_run", 2000, 300),
        _event("Node", "a_kernel_time", 2010, 60, "MatMul"),
        _event("Node", "b_kernel_time", 2050, 20, "MatMul"),
        _event("Node", "c_kernel_time", 2070, 30, "Add"),
    ]
    run_ms, runs, times = ops.op_times(list(reversed(trace)), skip=1, expected=2)  # in any order
    assert runs == [100, 300] and run_ms == pytest.approx(0.2)  # the mean of 100 and 300 us
    assert [(t.op, t.nodes) for t in times] == [("MatMul", 2), ("Add", 1)]
    assert times[0].ms == pytest.approx(0.070) and times[1].ms == pytest.approx(0.020)
    assert ops.op_times(trace, skip=3) is None
    with pytest.raises(HotrodError, match="2 of 5 runs"):  # onnxruntime stopped recording
        ops.op_times(trace, skip=1, expected=5)


def test_matrix_weights_counts_each_weight_once_and_no_activation_product(tmp_path):
    f32 = TensorProto.FLOAT
    w = numpy_helper.from_array(np.zeros((8, 4), np.float32), "w")  # 128 bytes, 32 multiply-adds a token
    q = numpy_helper.from_array(np.zeros((4, 2), np.int8), "q")  # 8 bytes through a DequantizeLinear
    scale = numpy_helper.from_array(np.ones((), np.float32), "s")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("MatMul", ["x", "w"], ["h2"]),  # the same weight again: read once
        helper.make_node("DequantizeLinear", ["q", "s"], ["qd"]),
        helper.make_node("MatMul", ["h", "qd"], ["y"]),
        helper.make_node("MatMul", ["h", "h2"], ["z"]),  # two activations: no weight
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f32, [1, 8])],
                              [helper.make_tensor_value_info("y", f32, None), helper.make_tensor_value_info("z", f32, None)],
                              initializer=[w, q, scale])
    file = tmp_path / "g.onnx"
    onnx.save_model(helper.make_model(graph), str(file))
    assert ops.matrix_weights(file) == (128 + 8, 32 + 8)


@pytest.mark.parametrize("name", ["gpt2", "t5", "bert"])
def test_profile_command_times_every_graph_it_runs(zoo, tmp_path, capsys, fixed_machine, name):
    figures = tmp_path / "ops.json"
    steps = [] if name == "bert" else ["--new-tokens", "3"]  # an encoder's refuses it (below)
    argv = ["profile", str(zoo.artifact(name)), "--length", "6", *steps, "--runs", "2", "--threads", "1",
            "--json", str(figures)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    written = json.loads(figures.read_text())
    manifest = json.loads((zoo.artifact(name) / "manifest.json").read_text())
    graphs = written["graphs"]
    assert {g["graph"] for g in graphs} <= set(manifest["graphs"]) and graphs
    assert written["steps"] == (1 if name == "bert" else 3)
    assert 0 <= written["outside_ms"] < written["work_ms"]
    assert 0 < written["runs_ms"] <= written["work_ms"]
    assert written["outside_ms"] == pytest.approx(written["work_ms"] - written["runs_ms"])
    for graph in graphs:  # exactly the timed runs' own graph runs: the warm-up's are left out
        assert graph["runs"] == 2 if graph["graph"] == "encoder" else graph["runs"] % 2 == 0
        assert graph["run_ms"] > 0 and graph["ops"]
        assert graph["work_kernels_ms"] == pytest.approx(graph["kernels_ms"] * graph["runs"] / 2)
        assert 0 < graph["kernels_ms"] == pytest.approx(sum(o["ms"] for o in graph["ops"]))
        assert graph["weight_mb"] > 0 and graph["traffic_floor_ms"] == pytest.approx(
            graph["weight_mb"] * 1e6 / (fixed_machine.bandwidth_gbs * 1e9) * 1e3)
        assert f"{graph['graph']}: {graph['runs']} runs" in out
    assert out.startswith("work: ") and "outside them" in out.splitlines()[0]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(("flag", "value"), [("--runs", "0"), ("--batch", "0"), ("--length", "100000"),
                                             ("--top", "0"), ("--new-tokens", "-1")])
def test_profile_refuses_options_out_of_range(zoo, capsys, flag, value):
    assert main(["profile", str(zoo.artifact("gpt2")), flag, value]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotrod: error:") and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", ["profile", "tune"])
def test_new_tokens_for_an_encoder_are_refused_not_ignored(zoo, capsys, command):
    assert main([command, str(zoo.artifact("bert")), "--new-tokens", "5"]) == 1
    assert "--new-tokens applies to a language model's artifact" in capsys.readouterr().err


def test_profile_needs_an_artifact(tmp_path, capsys):
    assert main(["profile", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("hotrod: error:")


@pytest.mark.parametrize("where", ["a directory", "no parent"])
def test_profile_checks_where_its_figures_go_before_profiling(zoo, tmp_path, capsys, monkeypatch, where):
    monkeypatch.setattr(ops, "profile_artifact", lambda *a, **k: pytest.fail("profiled before checking --json"))
    target = tmp_path if where == "a directory" else tmp_path / "missing" / "ops.json"
    assert main(["profile", str(zoo.artifact("bert")), "--json", str(target)]) == 1
    assert capsys.readouterr().err.startswith("hotrod: error:")


def test_profiling_belongs_to_onnxruntime(zoo):
    with pytest.raises(HotrodError, match="onnxruntime backend"):
        hotrod.load(zoo.checkpoint("gpt2"), backend="torch", profile=True)
    with pytest.raises(HotrodError, match="profile=True"):
        hotrod.load(zoo.artifact("gpt2")).backend.profile_events()
