"""Int8MatMulQuantized: a calibrated product whose one reader is a QuantizeLinear (int8-static's input to the next
product) quantized in the kernel's epilogue: onnxruntime's uint8 answers to the bit over odd shapes, scales that
saturate, zero points and the GELU, and the epilogue's quantization alone against onnxruntime's QuantizeLinear
over every range of float32 and every half-way quotient; a row the same alone and in any batch; the
QuantizeLinear nodes it cannot compute alike left as they are."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hotrod.runtime import i8, native
from tests.runtime.test_i8 import amx, run_all
from tests.runtime.test_i8_calibrated import calibrated, feeds
from tests.runtime.test_rows import _copy, _ops

pytestmark = pytest.mark.usefixtures("products_path")  # tests/runtime/conftest.py: each product path


def requantized(k: int, n: int, scale: float = 0.05, zero_point: int = 128, gelu: bool = True, seed: int = 0,
                shape: tuple = (), zero_type: int = TensorProto.UINT8, output: bool = True,
                **attributes) -> onnx.ModelProto:
    """calibrated()'s product (a bias, the GELU where asked) read by one QuantizeLinear with `scale` and
    `zero_point` (of `shape`), whose uint8 output is the graph's (or a DequantizeLinear's, `output` False)."""
    model = calibrated(k, n, gelu=gelu, seed=seed)
    graph = model.graph
    last = graph.node[-1].output[0]
    dtype = np.uint8 if zero_type == TensorProto.UINT8 else np.int8
    graph.initializer.extend([numpy_helper.from_array(np.full(shape, scale, np.float32), "s2"),
                              numpy_helper.from_array(np.full(shape, zero_point, dtype), "z2")])
    graph.node.append(helper.make_node("QuantizeLinear", [last, "s2", "z2"], ["yq"], **attributes))
    out = "yq"
    if not output:
        graph.node.append(helper.make_node("DequantizeLinear", ["yq", "s2", "z2"], ["yd"]))
        out = "yd"
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(out, zero_type if output else TensorProto.FLOAT, None))
    return model


def fused(model: onnx.ModelProto) -> onnx.ModelProto:
    out = _copy(model)
    assert i8.rewrite(out) == 1
    assert i8.quantize_static(out) == 1
    return out


def test_the_quantize_node_goes_into_the_op():
    model = requantized(64, 48)
    out = fused(model)
    assert _ops(out) == ["QuantizeLinear", i8.QUANTIZED_OP]  # the rows' own quantization stays onnxruntime's
    op = out.graph.node[1]
    assert list(op.input[-2:]) == ["s2", "z2"] and list(op.output) == ["yq"]


@pytest.mark.parametrize("change", ["per-channel", "int8", "graph output", "no zero point", "residual"])
def test_what_the_op_cannot_compute_alike_stays(change):
    if change == "per-channel":
        model = requantized(64, 48, shape=(48,), axis=-1)
    elif change == "int8":
        model = requantized(64, 48, zero_point=3, zero_type=TensorProto.INT8)
    elif change == "graph output":  # the product's floats are also the graph's: they must be written
        model = requantized(64, 48)
        model.graph.output.append(helper.make_tensor_value_info(model.graph.node[-2].output[0], TensorProto.FLOAT,
                                                                None))
    elif change == "no zero point":
        model = requantized(64, 48)
        del model.graph.node[-1].input[2:]
    else:
        model = calibrated(64, 48, residual=True)
        model.graph.node.append(helper.make_node("QuantizeLinear", ["summed", "s", "z"], ["yq"]))
    out = _copy(model)
    assert i8.rewrite(out) == 1
    assert i8.quantize_static(out) == 0 and "QuantizeLinear" in _ops(out)[1:]


@amx
@pytest.mark.parametrize("k, n", [(64, 17), (192, 96), (1024, 600)])
@pytest.mark.parametrize("count", [1, 16, 33, 300])
@pytest.mark.parametrize("scale, zero_point", [(0.05, 128), (0.004, 0), (0.3, 255), (0.01, 37)])
def test_the_same_uint8_as_onnxruntimes_quantize_node(k, n, count, scale, zero_point):
    """Row tails (past 16 and 32: the last rows' padded block), column tails, units of several column blocks;
    scales small enough that most values saturate at 0 or 255 and large enough that none do."""
    model = requantized(k, n, scale=scale, zero_point=zero_point, seed=k + n)
    inputs = feeds(model, count)
    theirs, ours = run_all(model, inputs)[0], run_all(fused(model), inputs, library=True)[0]
    assert ours.dtype == np.uint8 and np.array_equal(theirs, ours)
    if scale == 0.004:
        assert (ours == 255).any() and (ours == 0).any()


@amx
@pytest.mark.parametrize("gelu", [False, True])
def test_a_next_product_reads_the_same_rows(gelu):
    """The quantized rows dequantized again, as the next product's input reads them: the same floats."""
    model = requantized(128, 64, gelu=gelu, output=False)
    inputs = feeds(model, 40)
    assert np.array_equal(run_all(model, inputs)[0], run_all(fused(model), inputs, library=True)[0])


def _values(scale: float, zero_point: int) -> np.ndarray:
    """A sweep over every range of float32 (one bit pattern in 4,099); every quotient's exact half-way point
    from -zero_point to 255 - zero_point as scale times it, and the floats either side of each; the clamp's
    bounds; zeros, subnormals, infinities and NaN."""
    sweep = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halves = ((np.arange(-zero_point - 2, 258 - zero_point) + 0.5) * np.float64(scale)).astype(np.float32)
    near = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, np.float32(-np.inf))])
    bounds = (np.array([-zero_point, 255 - zero_point], np.float64) * scale).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-38, np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32)
    return np.concatenate([sweep, near, bounds, special]).astype(np.float32)


@amx
@pytest.mark.parametrize("scale", [0.05, 0.1, 2.0 ** -7, 3e-3, 1e-38, 1e30])
@pytest.mark.parametrize("zero_point", [0, 37, 128, 255])
def test_the_epilogues_quantization_is_onnxruntimes_to_the_bit(scale, zero_point):
    x = _values(scale, zero_point)
    ours = np.empty(x.size, np.uint8)
    function = ctypes.CDLL(str(native.library())).hotrod_quantize_static
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int32, ctypes.c_void_p]
    function.restype = None
    function(x.ctypes.data, x.size, scale, zero_point, ours.ctypes.data)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [None])],
                              [numpy_helper.from_array(np.array(scale, np.float32), "s"),
                               numpy_helper.from_array(np.array(zero_point, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    differ = ours != theirs
    assert not differ.any(), f"{differ.sum()} values differ, first at x = {x[differ][:3]}"


@amx
@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_is_the_same_alone_in_any_batch_and_at_any_thread_count(threads):
    model = fused(requantized(192, 600, seed=3))
    inputs = feeds(model, 77)
    whole = run_all(model, inputs, threads, library=True)[0]
    for first, last in ((0, 1), (5, 6), (40, 77), (16, 48)):
        part = {name: value[:, first:last] for name, value in inputs.items()}
        assert np.array_equal(run_all(model, part, threads, library=True)[0], whole[:, first:last])
