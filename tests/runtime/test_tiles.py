"""AMX's tiles left out (`HOTROD_TILES=off`, `native.tiles_left_out`): hotrod's kernels take the path a CPU without
them takes (the int8 and bf16 products and the attention on AVX-512), and say so where asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hotrod.errors import HotrodError
from hotrod.runtime import attention, bf16, i8, kernel_choice, native
from tests.runtime import test_bf16, test_i8
from tests.runtime.test_rows import _copy

tiles = pytest.mark.skipif(not (i8.available() and native.has_flags(("amx_tile",))),
                           reason="no tiles on this CPU to leave out")


def test_a_value_other_than_on_or_off_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv(native.TILES_ENV, "sideways")
    with pytest.raises(HotrodError, match="HOTROD_TILES must be on or off, not 'sideways'"):
        native.tiles_allowed()
    monkeypatch.setenv(native.TILES_ENV, " OFF ")
    assert not native.tiles_allowed()


@tiles
def test_left_out_the_products_and_attention_take_their_avx512_paths():
    record = kernel_choice.record_path()
    with native.tiles_left_out():
        assert not native.tiles_allowed()
        assert i8.available() == native.has_flags(("avx512_vnni",))
        assert bf16.available() == native.has_flags(("avx512_bf16",))
        assert attention.available() == native.has_flags(("avx512f", "avx512bw", "avx512vl"))
        assert not attention.on_tiles()
        assert not native.tiles_granted()
        assert kernel_choice.record_path() != record  # measured apart by `hotrod tune`
    assert native.tiles_allowed() and attention.on_tiles() == native.has_flags(("amx_bf16",))
    assert kernel_choice.record_path() == record


@tiles
def test_the_environment_leaves_them_out_for_the_whole_process():
    script = ("from hotrod.runtime import attention, i8, native; "
              "print(native.tiles_allowed(), i8.available(), attention.on_tiles())")
    env = {**os.environ, native.TILES_ENV: "off"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", str(native.has_flags(("avx512_vnni",))), "False"]


@tiles
def test_a_process_linux_refuses_the_tiles_runs_the_paths_without_them():
    """benchmarks/without_amx.sh: the grant refused to the process and its children, as on a Linux before 5.16."""
    script = ("from hotrod.runtime import attention, i8, native; "
              "print(native.tiles_allowed(), native.tiles_granted(), i8.available(), attention.on_tiles())")
    shim = Path(__file__).resolve().parents[2] / "benchmarks" / "without_amx.sh"
    out = subprocess.run([str(shim), sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", str(native.has_flags(("avx512_vnni",))), "False"]


def _attribute(model, op: str, name: str) -> int:
    node = next(n for n in model.graph.node if n.op_type == op)
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


@tiles
def test_each_op_is_told_its_path_as_its_graph_is_rewritten():
    int8 = test_i8.products(128, (64,))
    floats, _ = test_bf16.products(128, (64,))
    outside = [_copy(int8), _copy(floats)]
    assert i8.rewrite(outside[0]) and bf16.rewrite(outside[1])
    with native.tiles_left_out():
        inside = [_copy(int8), _copy(floats)]
        assert i8.rewrite(inside[0]) and bf16.rewrite(inside[1])
    assert [_attribute(m, op, "tiles") for m, op in zip(outside, (i8.OP, bf16.OP))] == [1, 1]
    assert [_attribute(m, op, "tiles") for m, op in zip(inside, (i8.OP, bf16.OP))] == [0, 0]


@tiles
def test_a_session_loaded_on_the_tiles_keeps_them_while_others_leave_them_out():
    """The bf16 paths sum in different orders: a session's answers must not move with another's choice."""
    floats, _ = test_bf16.products(256, (96,))
    x = {"x": np.random.default_rng(1).standard_normal((37, 256)).astype(np.float32)}
    before = _session(test_bf16.rewritten(floats))
    alone = before.run(None, x)[0]
    with native.tiles_left_out():
        assert np.array_equal(before.run(None, x)[0], alone)
        without = _session(test_bf16.rewritten(floats)).run(None, x)[0]
    test_bf16.assert_sums_close(without, x["x"], *_weights(floats))
    assert np.array_equal(before.run(None, x)[0], alone)


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    native.use_library(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _weights(model):
    arrays = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    return arrays["w0"], arrays.get("b0")


def _clear_caches() -> None:
    for cached in (native._handle, native._granted, native.vectors_ready):
        cached.cache_clear()


@pytest.mark.skipif(native.library() is None, reason="no kernels' library on this machine")
def test_a_library_built_from_other_sources_is_left_unused(monkeypatch):
    """Its ops would not read the attributes this side writes: onnxruntime's ops run instead."""
    monkeypatch.setattr(native, "KERNELS_VERSION", native.KERNELS_VERSION + 1)
    _clear_caches()
    try:
        assert native._handle() is None
        assert not (i8.available() or bf16.available() or attention.available() or native.tiles_granted())
        assert native.tiles_state() == "none"
    finally:
        monkeypatch.undo()
        _clear_caches()
    assert native._handle() is not None
