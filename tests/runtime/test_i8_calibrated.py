"""hotrod's int8 product kernel (AMX) on calibrated graphs (int8-static's QDQ products): the same answers as
onnxruntime's fused MatMulIntegerToFloat, bit for bit, over odd shapes, zero points, biases, GELU and residuals;
what it cannot compute alike left as it is; a loaded int8-static model's answers unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import hotrod
from hotrod.runtime import i8
from tests.runtime.test_i8 import amx, run_all
from tests.runtime.test_rows import _copy, _ops
from tests.zoo import CASES, prompt_batch

pytestmark = pytest.mark.usefixtures("products_path")  # tests/runtime/conftest.py: each product path


def calibrated(k: int, n: int, zero_point: int = 117, scale: float = 0.02, bias: str | None = "first",
               gelu: bool = False, residual: bool = False, weight_zero: int = 0, column_scales: bool = True,
               seed: int = 0, shape: tuple = (), axis: int = 1) -> onnx.ModelProto:
    """x [1, rows, k] -> QuantizeLinear -> DequantizeLinear -> MatMul by DequantizeLinear(int8 W [k, n]) [-> Add
    of a bias, on the side `bias` names] [-> com.microsoft Gelu] [-> Add of a residual input r], as onnxruntime's
    static quantization writes a product (uint8 rows, one scale and zero point; int8 weights, 7 bits)."""
    rng = np.random.default_rng(seed)
    w_scales = rng.uniform(0.001, 0.02, n if column_scales else 1).astype(np.float32)
    inits = [numpy_helper.from_array(np.full(shape, scale, np.float32), "s"),  # shape: () or (1,), per tensor
             numpy_helper.from_array(np.full(shape, zero_point, np.uint8), "z"),
             numpy_helper.from_array(rng.integers(-64, 65, (k, n)).astype(np.int8), "wq"),
             numpy_helper.from_array(w_scales if column_scales else w_scales.reshape(()), "ws"),
             numpy_helper.from_array(np.full(n if column_scales else (), weight_zero, np.int8), "wz"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=axis),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", k])]
    if bias is not None:
        nodes.append(helper.make_node("Add", ["b", "y"] if bias == "first" else ["y", "b"], ["biased"]))
    if gelu:
        nodes.append(helper.make_node("Gelu", [nodes[-1].output[0]], ["gelu"], domain="com.microsoft"))
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, "rows", n]))
        nodes.append(helper.make_node("Add", [nodes[-1].output[0], "r"], ["summed"]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(nodes[-1].output[0],
                                                                                 TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def feeds(model: onnx.ModelProto, count: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {value.name: [d.dim_value or count for d in value.type.tensor_type.shape.dim] for value in model.graph.input}
    return {name: (rng.standard_normal(shape) * 1.5).astype(np.float32) for name, shape in shapes.items()}


def both(model: onnx.ModelProto, inputs: dict[str, np.ndarray], threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's answer to the graph as it is (it fuses a QDQ product into its MatMulIntegerToFloat), and the
    kernel's to it rewritten."""
    out = _copy(model)
    assert i8.rewrite(out) == 1
    return run_all(model, inputs, threads)[0], run_all(out, inputs, threads, library=True)[0]


def test_a_calibrated_product_becomes_one_op_and_its_dequantize_nodes_go():
    model = calibrated(64, 48, gelu=True, residual=True)
    out = _copy(model)
    assert i8.rewrite(out) == 1
    assert _ops(out) == ["QuantizeLinear", i8.OP]  # the rows' quantization stays onnxruntime's
    op = out.graph.node[1]
    assert list(op.input)[:2] == ["q", next(init.name for init in out.graph.initializer if init.name.startswith(
        "hotrod_i8_unit_scale"))] and op.input[-1] == "r"
    assert {"wq", "ws", "wz", "b"}.isdisjoint(init.name for init in out.graph.initializer)
    assert {"s", "z"} <= {init.name for init in out.graph.initializer}  # QuantizeLinear still reads them


@amx
@pytest.mark.parametrize("k, n", [(64, 17), (192, 96), (1024, 40)])
@pytest.mark.parametrize("count", [1, 16, 33, 300])
@pytest.mark.parametrize("zero_point", [0, 117, 128, 255])
def test_the_same_answers_as_onnxruntimes_fused_nodes(k, n, count, zero_point):
    model = calibrated(k, n, zero_point=zero_point, seed=k + n)
    theirs, ours = both(model, feeds(model, count))
    assert np.array_equal(theirs, ours)


@amx
@pytest.mark.parametrize("bias", [None, "first", "second"])
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_bias_gelu_and_residual_as_onnxruntime_computes_them(bias, gelu, residual):
    model = calibrated(128, 80, bias=bias, gelu=gelu, residual=residual)
    theirs, ours = both(model, feeds(model, 37))
    assert np.array_equal(theirs, ours)


@amx
def test_a_scale_and_zero_point_of_one_element_as_scalars():
    model = calibrated(64, 48, zero_point=201, shape=(1,))
    theirs, ours = both(model, feeds(model, 21))
    assert np.array_equal(theirs, ours)


@amx
def test_one_weight_scale_for_every_column_and_a_row_alone_as_in_its_batch():
    model = calibrated(64, 32, column_scales=False)
    inputs = feeds(model, 50)
    theirs, ours = both(model, inputs, threads=3)
    assert np.array_equal(theirs, ours)
    alone = both(model, {"x": inputs["x"][:, 7:8]})[1]
    assert np.array_equal(alone, ours[:, 7:8])


def test_what_the_kernel_cannot_compute_alike_is_left_as_it_is():
    assert i8.rewrite(calibrated(64, 32, weight_zero=3)) == 0  # weights with a zero point
    assert i8.rewrite(calibrated(40, 32)) == 0  # a depth the tiles do not step through
    shared = calibrated(64, 32)
    shared.graph.output.append(helper.make_tensor_value_info("xd", TensorProto.FLOAT, None))  # rows read elsewhere
    out = _copy(shared)
    assert i8.rewrite(out) == 1 and "DequantizeLinear" in _ops(out)  # the op, and the node the output reads
    fed = calibrated(64, 32)
    fed.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, []))  # a scale a caller may give
    assert i8.rewrite(fed) == 0
    other_axis = calibrated(64, 64)
    other_axis.graph.node[2].attribute[0].i = 0  # [64] scales along K, not along the columns
    assert i8.rewrite(other_axis) == 0
    requantized = calibrated(64, 32, bias=None)  # quantized again at once: onnxruntime's QLinearMatMul, not ours
    requantized.graph.node.append(helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"]))
    requantized.graph.output[0].CopyFrom(helper.make_tensor_value_info("yq", TensorProto.UINT8, None))
    assert i8.rewrite(requantized) == 0


@amx
def test_a_loaded_int8_static_model_multiplies_on_the_kernel_with_the_same_answers(zoo, tmp_path, monkeypatch):
    out = hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "bert", precision="int8-static", force=True,
                          progress=False, verify_examples=0)
    model = hotrod.load(out)
    assert all(i8.OP in ops for ops in model.backend.kernel_ops.values())
    monkeypatch.setattr(i8, "available", lambda: False)
    plain = hotrod.load(out)
    assert not any(i8.OP in ops for ops in plain.backend.kernel_ops.values())
    ids, mask = prompt_batch(CASES["bert"], (5, 3))
    assert torch.equal(model(ids, attention_mask=mask).last_hidden_state,
                       plain(ids, attention_mask=mask).last_hidden_state)
