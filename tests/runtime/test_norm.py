"""hotrod's LayerNormalization kernel: the same bits as onnxruntime's own op over widths, row counts (groups and
short groups), scales, epsilons and edge values; with the next product's quantization fused, the same q and
scales as QuantizeRows, or the same q as a calibrated QuantizeLinear; a row the same alone and in any batch;
graphs it cannot take left as they are."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import hotrod
from hotrod.runtime import attention, native, norm, rows
from tests.zoo import CASES, prompt_batch

library = pytest.mark.skipif(native.library() is None, reason="no kernels' library for this CPU: onnxruntime's ops run")
probed = pytest.mark.skipif(native.library() is None or not norm.same_as_onnxruntime(768, 1e-12),
                            reason="this onnxruntime's LayerNormalization sums otherwise: its own op runs")


def layer_norm(width: int, epsilon: float = 1e-12, seed: int = 0, quantized: bool = False,
               **attrs) -> onnx.ModelProto:
    """x [rows, width] -> LayerNormalization (random gamma and beta) -> y, and where `quantized`, y's per-row
    quantization as QuantizeRows (q and scales graph outputs too)."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), name) for name in ("g", "b")]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=epsilon, **attrs)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if quantized:
        nodes.append(helper.make_node(rows.OP, ["y"], ["q", "s"], domain=native.DOMAIN))
        outputs += [helper.make_tensor_value_info("q", TensorProto.UINT8, None),
                    helper.make_tensor_value_info("s", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", width])],
                              outputs, weights)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(native.DOMAIN, 1)] if quantized else [])
    return helper.make_model(graph, opset_imports=opsets)


def run(model: onnx.ModelProto, x: np.ndarray, kernel: bool, threads: int = 1) -> list[np.ndarray]:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if kernel:
        assert norm.rewrite(copy) == 1
    if kernel or any(node.domain == native.DOMAIN for node in copy.graph.node):
        native.use_library(options)
    session = ort.InferenceSession(copy.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _rows(count: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.logspace(-4, 5, count)[:, None]
    return (rng.standard_normal((count, width)) * scales + rng.standard_normal((count, 1)) * scales).astype(np.float32)


@probed
@pytest.mark.parametrize("width", [8, 16, 48, 768, 1024, 4104])
@pytest.mark.parametrize("count", [1, 3, 4, 5, 130])
@pytest.mark.parametrize("epsilon", [1e-12, 1e-5, 0.5])
def test_the_same_bits_as_onnxruntimes_layer_normalization(width, count, epsilon):
    model, x = layer_norm(width, epsilon, seed=width), _rows(count, width, seed=count)
    assert np.array_equal(run(model, x, kernel=False)[0], run(model, x, kernel=True)[0])


@probed
def test_edge_values_give_what_onnxruntime_gives():
    """A constant row (variance 0: 1 / sqrt(epsilon)), a zero row, huge values, an infinity, a NaN."""
    x = np.ones((6, 64), np.float32)
    x[1] = 0.0
    x[2] = 3e38
    x[3, 5] = np.inf
    x[4, 9] = np.nan
    x[5] = np.linspace(-1e-30, 1e-30, 64)
    model = layer_norm(64)
    assert np.array_equal(run(model, x, kernel=False)[0], run(model, x, kernel=True)[0], equal_nan=True)


@probed
@pytest.mark.parametrize("width", [24, 768])  # 24: a last step of 8 values on the AVX-512 path
@pytest.mark.parametrize("count", [1, 37, 300])
def test_the_quantized_output_is_quantize_rows_of_the_same_bits(count, width):
    _one_op_with_the_same_outputs(layer_norm(width, quantized=True), _rows(count, width, seed=5), norm.ROWS_OP)


def _one_op_with_the_same_outputs(model: onnx.ModelProto, x: np.ndarray, op: str) -> None:
    """The graph rewritten is the one `op`, and its outputs are onnxruntime's own, to the bit."""
    theirs, ours = run(model, x, kernel=False), run(model, x, kernel=True)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    norm.rewrite(rewritten)
    assert [node.op_type for node in rewritten.graph.node] == [op]
    for a, b in zip(theirs, ours):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def calibrated_norm(width: int, scale: float, zero_point: int, shape: tuple = ()) -> onnx.ModelProto:
    """layer_norm()'s y read by a QuantizeLinear with one scale and uint8 zero point (int8-static's next product's
    input; `shape` (width,) and an axis: per channel), y and its q both graph outputs."""
    model = layer_norm(width)
    graph = model.graph
    graph.initializer.extend([numpy_helper.from_array(np.full(shape, scale, np.float32), "qs"),
                              numpy_helper.from_array(np.full(shape, zero_point, np.uint8), "qz")])
    graph.node.append(helper.make_node("QuantizeLinear", ["y", "qs", "qz"], ["q"], **({"axis": -1} if shape else {})))
    graph.output.append(helper.make_tensor_value_info("q", TensorProto.UINT8, None))
    return model


@probed
@pytest.mark.parametrize("width", [24, 768])
@pytest.mark.parametrize("count", [1, 37, 300])
@pytest.mark.parametrize("scale, zero_point", [(0.05, 128), (0.004, 0), (0.3, 255)])
def test_a_calibrated_quantization_after_it_gives_the_same_q(count, width, scale, zero_point):
    _one_op_with_the_same_outputs(calibrated_norm(width, scale, zero_point), _rows(count, width, seed=6), norm.FIXED_OP)


@probed
def test_a_per_channel_quantization_after_it_stays_onnxruntimes():
    model = calibrated_norm(64, 0.05, 128, shape=(64,))
    assert norm.rewrite(model) == 1
    assert [node.op_type for node in model.graph.node] == [norm.OP, "QuantizeLinear"]


@probed
@pytest.mark.parametrize("width", [40, 64])
def test_edge_values_quantize_as_quantize_rows_quantizes_them(width):
    """The largest |y| the normalizing pass finds for the quantization: a NaN or an infinity in the row (a NaN
    scale), a zero row, a constant one, huge and tiny values, a last value larger than the rest."""
    x = np.ones((8, width), np.float32)
    x[1] = 0.0
    x[2] = 3e38
    x[3, 5] = np.inf
    x[4, 9] = np.nan
    x[5] = np.linspace(-1e-30, 1e-30, width)
    x[6, -1] = 1e4
    x[7, -1] = np.nan
    model = layer_norm(width, quantized=True)
    for a, b in zip(run(model, x, kernel=False), run(model, x, kernel=True)):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@probed
@pytest.mark.parametrize("quantized", [False, True])
def test_no_rows_give_every_output_empty(quantized):
    outputs = run(layer_norm(64, quantized=quantized), np.zeros((0, 64), np.float32), kernel=True)
    assert [out.shape for out in outputs] == [(0, 64)] + ([(0, 64), (0, 1)] if quantized else [])


@probed
def test_a_row_is_the_same_alone_in_any_batch_and_at_any_thread_count():
    model, x = layer_norm(1024, quantized=True), _rows(600, 1024, seed=3)
    alone = run(model, x[5:6], kernel=True)
    for threads in (1, 2, 3):
        batch = run(model, x, kernel=True, threads=threads)
        assert all(np.array_equal(a[5:6], b) for a, b in zip(batch, alone))


@pytest.mark.parametrize("left", ["axis", "width", "gamma", "statistics", "embeddings", "stash", "opset"])
def test_what_the_kernel_does_not_compute_is_left_to_onnxruntime(left, monkeypatch):
    monkeypatch.setattr(norm, "same_as_onnxruntime", lambda width, epsilon: True)
    width = 20 if left == "width" else 16
    model = layer_norm(width, **({"axis": 0} if left == "axis" else {}), **({"stash_type": 0} if left == "stash" else {}))
    graph, node = model.graph, model.graph.node[0]
    if left == "gamma":  # gamma fed, not constant
        graph.initializer.remove(next(init for init in graph.initializer if init.name == "g"))
        graph.input.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [width]))
    elif left == "statistics":
        node.output.extend(["mean"])
        graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    elif left == "opset":  # onnxruntime's contrib op of that name
        model.opset_import[0].version = 16
    elif left == "embeddings":
        graph.initializer.append(numpy_helper.from_array(np.ones((10, width), np.float32), "table"))
        graph.input[0].CopyFrom(helper.make_tensor_value_info("ids", TensorProto.INT64, ["rows"]))
        graph.node.insert(0, helper.make_node("Gather", ["table", "ids"], ["rows"]))
        graph.node.insert(1, helper.make_node("Add", ["rows", "rows"], ["x"]))
    assert norm.rewrite(model) == 0 and model.graph.node[-1].op_type == "LayerNormalization"


def test_nothing_is_rewritten_where_the_probe_finds_other_bits(monkeypatch):
    monkeypatch.setattr(norm, "same_as_onnxruntime", lambda width, epsilon: False)
    model = layer_norm(768)
    assert norm.rewrite(model) == 0 and model.graph.node[0].op_type == "LayerNormalization"


@library
def test_the_probe_compares_with_onnxruntime(monkeypatch):
    """A probe that saw onnxruntime's answers nudged by one ulp says no."""
    norm.same_as_onnxruntime.cache_clear()
    nudged = norm._onnxruntime
    monkeypatch.setattr(norm, "_onnxruntime", lambda *args: np.nextafter(nudged(*args), np.float32(np.inf)))
    try:
        assert not norm.same_as_onnxruntime(64, 1e-5)
    finally:
        norm.same_as_onnxruntime.cache_clear()


@probed
def test_a_loaded_int8_encoder_normalizes_on_the_kernel_with_the_same_answers(zoo, tmp_path, monkeypatch):
    out = hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "bert", precision="int8", force=True, progress=False,
                          verify_examples=0)
    monkeypatch.setattr(attention, "available", lambda: False)  # bf16 attention changes the answers
    model = hotrod.load(out)
    assert any({norm.OP, norm.ROWS_OP} & ops for ops in model.backend.kernel_ops.values())
    monkeypatch.setattr(norm, "rewrite", lambda graph: 0)
    theirs = hotrod.load(out)
    ids, mask = prompt_batch(CASES["bert"], (5, 3))
    assert torch.equal(model(ids, attention_mask=mask).last_hidden_state,
                       theirs(ids, attention_mask=mask).last_hidden_state)
