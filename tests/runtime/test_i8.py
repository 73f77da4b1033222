"""hotrod's int8 product kernel (AMX): the same answers as onnxruntime's nodes, bit for bit, over odd shapes,
tails and thread counts; every row alone the same as in any batch; graphs it cannot take left as they are;
a fallback wherever the CPU or the build lacks it; a loaded int8 model's answers unchanged."""

from __future__ import annotations

import multiprocessing
import threading
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import hotrod
from hotrod.optimize.quantize import int8_dynamic
from hotrod.runtime import cpu_kernels, i8, native, rows
from hotrod.runtime.ort_sessions import CPU_DISABLED_OPTIMIZERS
from tests.runtime.test_rows import _copy, _ops
from tests.zoo import CASES, prompt_batch

pytestmark = pytest.mark.usefixtures("products_path")  # tests/runtime/conftest.py: each product path

amx = pytest.mark.skipif(not i8.available(), reason="no AMX on this CPU (or no tile state): onnxruntime's kernel runs")


def products(k: int, widths: tuple[int, ...] = (96,), bias: bool = True, seed: int = 0,
             gelu: dict | None = None) -> onnx.ModelProto:
    """`float_products`, quantized per row as hotrod's int8 build does."""
    return int8_dynamic(float_products(k, widths, bias, seed, gelu), per_row=True)


def float_products(k: int, widths: tuple[int, ...] = (96,), bias: bool = True, seed: int = 0,
                   gelu: dict | None = None) -> onnx.ModelProto:
    """x [rows, k] -> MatMul (+ bias) (-> Gelu, where `gelu` gives its domain and attributes) one after another,
    in fp32."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "x"
    for i, n in enumerate(widths):
        weights.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.1, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}" if bias else f"y{i}"]))
        if bias:
            weights.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{i}"))
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"]))
        if gelu is not None:
            nodes.append(helper.make_node("Gelu", [f"y{i}"], [f"g{i}"], **gelu))
        x, k = f"g{i}" if gelu is not None else f"y{i}", n
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "k"])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], weights)
    opsets = [helper.make_opsetid("", 20 if gelu is not None else 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


GELUS = {"com.microsoft": {"domain": "com.microsoft"}, "onnx": {}, "onnx, approximate none": {"approximate": "none"}}


def split_product(k: int, width: int, sizes: list[int] | None = None, seed: int = 0) -> onnx.ModelProto:
    """x [rows, k] -> MatMul + bias -> Split of the last axis into three (a fused Q/K/V product), int8 per row;
    the sizes from a Constant node."""
    rng = np.random.default_rng(seed)
    sizes = sizes or [width] * 3
    n = sum(sizes)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["qkv"]),
             helper.make_node("Constant", [], ["sizes"], value=numpy_helper.from_array(np.array(sizes, np.int64))),
             helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1)]
    weights = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.1, "w"),
               numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "qkv"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
                              outputs, weights)
    return int8_dynamic(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), per_row=True)


def rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    """As a graph is loaded: the products, the per-row quantization, the products quantizing their outputs."""
    out = _copy(model)
    assert i8.rewrite(out) > 0
    rows.rewrite(out)
    i8.quantize_outputs(out)
    return out


def run_all(model: onnx.ModelProto, x: np.ndarray | dict[str, np.ndarray], threads: int = 2,
            library: bool = False) -> list[np.ndarray]:
    """The graph's outputs for `x` (its input "x", or every input by name) in a session as hotrod opens them."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if library:
        native.use_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=CPU_DISABLED_OPTIMIZERS)
    return session.run(None, x if isinstance(x, dict) else {"x": x})


def run(model: onnx.ModelProto, x: np.ndarray, threads: int = 2, library: bool = False) -> np.ndarray:
    return run_all(model, x, threads, library)[0]


def test_each_product_chain_becomes_one_op_and_the_weights_go_packed():
    model = products(128, (192, 64))
    ours = _copy(model)
    assert i8.rewrite(ours) == 2
    ops = _ops(ours)
    assert ops.count(i8.OP) == 2 and not {"MatMulInteger", "Cast", "Mul", "Sub"} & set(ops)
    names = {init.name for init in ours.graph.initializer}
    assert not {"w0_quantized", "w1_quantized"} & names  # the unpacked weights are gone
    known = {"x", ""} | names
    for node in ours.graph.node:  # in an order onnxruntime can run
        assert set(node.input) <= known
        known |= set(node.output)


def test_a_fused_qkv_products_split_goes_into_the_op():
    model = split_product(64, 48)
    ours = _copy(model)
    assert i8.rewrite(ours) == 1
    assert _ops(ours).count(i8.SPLIT_OP) == 1 and not {"Split", "Constant"} & set(_ops(ours))
    for sizes in ([48, 48, 32], [40, 40, 40]):  # unequal, or not a multiple of 16 wide: the Split stays
        other = split_product(64, 0, sizes)
        assert i8.rewrite(other) == 1 and "Split" in _ops(other) and i8.SPLIT_OP not in _ops(other)


def _split_node(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.op_type == "Split")


def test_a_split_without_sizes_goes_in_one_whose_sizes_a_caller_may_feed_stays():
    """No sizes input: three equal parts by its outputs' count. Sizes from an initializer that is also a graph
    input: a caller may feed others, so the Split stays."""
    plain = split_product(64, 48)
    del _split_node(plain).input[1:]
    assert i8.rewrite(plain) == 1 and i8.SPLIT_OP in _ops(plain) and "Split" not in _ops(plain)
    fed = split_product(64, 48)
    constant = next(node for node in fed.graph.node if node.op_type == "Constant" and node.output[0] == "sizes")
    fed.graph.node.remove(constant)
    fed.graph.initializer.append(numpy_helper.from_array(np.array([48] * 3, np.int64), "sizes"))
    fed.graph.input.append(helper.make_tensor_value_info("sizes", TensorProto.INT64, [3]))
    assert i8.rewrite(fed) == 1 and "Split" in _ops(fed) and i8.SPLIT_OP not in _ops(fed)


@amx
@pytest.mark.parametrize("count", [1, 5, 33])
def test_the_split_outputs_are_onnxruntimes_split_to_the_bit(count):
    x = np.random.default_rng(count).standard_normal((count, 128)).astype(np.float32)
    model = split_product(128, 64)
    theirs, ours = run_all(model, x), run_all(rewritten(model), x, library=True)
    assert len(ours) == 3 and all(a.shape == (count, 64) and np.array_equal(a, b) for a, b in zip(theirs, ours))


def test_the_packed_layout_is_the_tiles():
    rng = np.random.default_rng(3)
    w = rng.integers(-64, 65, (128, 40)).astype(np.int8)
    packed, offsets, scales, bias = i8.pack(w, np.full(40, 0.5, np.float32), None)
    assert packed.shape == (2, 2, 2048) and offsets.shape == scales.shape == bias.shape == (64,)
    for k, n in [(0, 0), (5, 17), (127, 39), (64, 33), (70, 31)]:
        block, depth, half, col = n // 32, k // 64, n % 32 // 16, n % 16
        assert packed[block, depth, half * 1024 + (k % 64 // 4) * 64 + col * 4 + k % 4] == w[k, n]
    assert not packed[1, :, 1024:].any()  # columns 48..63 are padding
    assert np.array_equal(offsets[:40], 128 * w.astype(np.int32).sum(axis=0)) and not offsets[40:].any()
    assert not bias.any() and scales[39] == 0.5 and scales[40] == 0


@amx
@pytest.mark.parametrize("k", [64, 192, 1024])
@pytest.mark.parametrize("n", [1, 17, 32, 100, 600, 2200])
@pytest.mark.parametrize("count", [1, 16, 31, 33, 300])
def test_the_same_answers_as_onnxruntimes_nodes(k, n, count):
    """Row tails (past 16 and 32), column tails (past 16 and 32), more than one block of rows; units of
    several column blocks (each asking for the next one's weights) and the widest units (2,200 columns); with
    the bias as the build writes it (subtracted, negated) and without one."""
    rng = np.random.default_rng(k + n + count)
    x = (rng.standard_normal((count, k)) * rng.uniform(0.01, 100, (count, 1))).astype(np.float32)
    x[0, :4] = [1.0, -1.0, 0.5, -2.5]
    if count > 2:
        x[1] = 0.0
    for bias in (True, False):
        model = products(k, (n,), bias=bias)
        assert np.array_equal(run(model, x), run(rewritten(model), x, library=True))


@amx
@pytest.mark.parametrize("residual", [False, True])
def test_a_deep_products_columns_go_through_in_panels_with_the_same_answers(residual):
    """Depth 4096 (a panel of 64 columns of weights without tiles) over 1,100 rows and 520 columns: units of 256
    columns, several panels each, each panel asking for the next one's weights; a row tail and a column tail."""
    rng = np.random.default_rng(4096)
    x = (rng.standard_normal((1100, 4096)) * rng.uniform(0.01, 10, (1100, 1))).astype(np.float32)
    if residual:
        model = residual_product(4096, 520, None)
        feeds = {"x": x, "r": rng.standard_normal((1100, 520)).astype(np.float32)}
        assert np.array_equal(run_feeds(model, feeds), run_feeds(rewritten(model), feeds, library=True))
    else:
        model = products(4096, (520,))
        assert np.array_equal(run(model, x), run(rewritten(model), x, library=True))


@pytest.mark.parametrize("gelu", GELUS.values(), ids=GELUS.keys())
def test_a_gelu_after_a_product_goes_into_its_epilogue(gelu):
    model = products(64, (64, 32), gelu=gelu)
    assert i8.rewrite(model) == 2
    assert "Gelu" not in _ops(model)
    assert [helper.get_attribute_value(a) for node in model.graph.node for a in node.attribute
            if a.name == "activation"] == [i8.GELU, i8.GELU]
    for kept in ({"approximate": "tanh"}, {"domain": "com.microsoft", "approximate": "tanh"}):
        other = products(64, (64,), gelu=kept)  # another arithmetic: the Gelu stays a node of its own
        assert i8.rewrite(other) == 1 and "Gelu" in _ops(other)
    split = split_product(64, 48)
    assert i8.rewrite(split) == 1 and i8.SPLIT_OP in _ops(split)


@amx
@pytest.mark.parametrize("gelu", GELUS.values(), ids=GELUS.keys())
@pytest.mark.parametrize("count", [1, 7, 33, 300])
def test_the_epilogues_gelu_is_onnxruntimes_to_the_bit(gelu, count):
    """Rows scaled from 1e-3 to 1e3 (GELU's polynomial, its exponential side, the clamp past |x| = 5.5 and
    values whose half is subnormal all met), with and without a bias; two products in a row, the second
    reading the first's GELU."""
    rng = np.random.default_rng(count)
    x = (rng.standard_normal((count, 128)) * np.exp(rng.uniform(-7, 7, (count, 1)))).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 1e-30]
    for bias in (True, False):
        model = products(128, (96, 40), bias=bias, gelu=gelu)
        theirs, ours = run(model, x), run(rewritten(model), x, library=True)
        assert theirs.shape == ours.shape and np.array_equal(theirs.view(np.uint32), ours.view(np.uint32))


def residual_product(k: int, n: int, residual: list | None, first: bool = False, gelu: bool = False) -> onnx.ModelProto:
    """x [rows, k] -> MatMul + bias (-> Gelu) -> Add(r), r a graph input of the given shape (the product's own
    shape where None; `first`: r the Add's first input), int8 per row."""
    rng = np.random.default_rng(k + n)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    if gelu:
        nodes.append(helper.make_node("Gelu", ["y"], ["g"], domain="com.microsoft"))
    product = "g" if gelu else "y"
    nodes.append(helper.make_node("Add", ["r", product] if first else [product, "r"], ["out"]))
    weights = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.1, "w"),
               numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k]),
              helper.make_tensor_value_info("r", TensorProto.FLOAT, residual)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return int8_dynamic(helper.make_model(graph, opset_imports=opsets), per_row=True)


def run_feeds(model: onnx.ModelProto, feeds: dict, library: bool = False) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if library:
        native.use_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=CPU_DISABLED_OPTIMIZERS)
    return session.run(None, feeds)[0]


def test_a_residual_added_after_a_product_goes_into_the_op():
    model = residual_product(64, 64, None, gelu=True)
    assert i8.rewrite(model) == 1
    node = next(node for node in model.graph.node if node.op_type == i8.OP)
    assert node.input[-1] == "r" and node.output[0] == "out" and {"Add", "Gelu"}.isdisjoint(_ops(model))
    constant = products(64, (64,))  # an Add of a constant past the bias is not a residual: it stays
    last = constant.graph.output[0].name
    constant.graph.initializer.append(numpy_helper.from_array(np.ones(64, np.float32), "c"))
    constant.graph.node.append(helper.make_node("Add", [last, "c"], ["shifted"]))
    constant.graph.output[0].name = "shifted"
    assert i8.rewrite(constant) == 1 and "Add" in _ops(constant)


def two_products_added(k: int, n: int) -> onnx.ModelProto:
    """x [rows, k] -> (MatMul + bias) + (MatMul + bias): an Add that both products' chains could end at."""
    rng = np.random.default_rng(k + n)
    nodes, weights = [], []
    for i in range(2):
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"],
                                                                                        [f"y{i}"])]
        weights += [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.1, f"w{i}"),
                    numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{i}")]
    nodes.append(helper.make_node("Add", ["y0", "y1"], ["out"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], weights)
    return int8_dynamic(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), per_row=True)


def test_an_add_of_two_products_goes_into_one_of_them():
    model = two_products_added(64, 32)
    assert i8.rewrite(model) == 2
    ops = [node for node in model.graph.node if node.op_type == i8.OP]
    assert len(ops) == 2 and sum(len(node.input) == 7 for node in ops) == 1 and "Add" not in _ops(model)
    known = {"x", ""} | {init.name for init in model.graph.initializer}
    for node in model.graph.node:  # in an order onnxruntime can run
        assert set(node.input) <= known
        known |= set(node.output)


def test_a_graph_output_within_a_chain_ends_it_there():
    model = products(64, (64,), gelu=GELUS["com.microsoft"])
    bias = next(node for node in model.graph.node if node.op_type == "Gelu").input[0]
    model.graph.output.append(helper.make_tensor_value_info(bias, TensorProto.FLOAT, None))
    assert i8.rewrite(model) == 1  # the product (with its bias) still goes; the Gelu stays a node
    assert "Gelu" in _ops(model) and not any(a.name == "activation" for node in model.graph.node
                                              for a in node.attribute)


@amx
def test_an_add_of_two_products_gives_onnxruntimes_answer():
    x = np.random.default_rng(8).standard_normal((40, 64)).astype(np.float32)
    model = two_products_added(64, 32)
    assert np.array_equal(run(model, x), run(rewritten(model), x, library=True))


@amx
@pytest.mark.parametrize("shape", [None, [1, 64], [64], [3, 1, 64], [], [5, 1]],
                         ids=["own", "one row", "one vector", "wider", "scalar", "one column"])
@pytest.mark.parametrize("first", [False, True], ids=["second", "first"])
def test_the_residual_is_added_as_onnxruntimes_add_in_every_shape_it_broadcasts(shape, first):
    """The product's own shape is added in the epilogue; any other that broadcasts (to the product's shape or
    wider), after it; the same bits and shape as onnxruntime's Add either way."""
    rows = 5
    rng = np.random.default_rng(len(shape or []) + first)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    r = rng.standard_normal([rows, 64] if shape is None else shape).astype(np.float32)
    for gelu in (False, True):
        model = residual_product(64, 64, ["rows", 64] if shape is None else shape, first=first, gelu=gelu)
        theirs = run_feeds(model, {"x": x, "r": r})
        ours = run_feeds(rewritten(model), {"x": x, "r": r}, library=True)
        assert theirs.shape == ours.shape and np.array_equal(theirs, ours)


@amx
def test_a_residual_that_does_not_broadcast_gives_nan():
    model = rewritten(residual_product(64, 64, ["a", "b"]))
    out = run_feeds(model, {"x": np.ones((5, 64), np.float32), "r": np.ones((4, 64), np.float32)}, library=True)
    assert np.isnan(out).all()


def test_a_product_read_only_by_the_next_ones_quantization_quantizes_its_output_itself():
    model = products(64, (64, 64, 32), gelu=GELUS["com.microsoft"])
    assert i8.rewrite(model) == 3 and rows.rewrite(model) == 3
    assert i8.quantize_outputs(model) == 2  # the last product's output is the graph's
    ops = _ops(model)
    assert ops.count(i8.ROWS_OP) == 2 and ops.count(rows.OP) == 1 and ops.count(i8.OP) == 1
    known = {"x", ""} | {init.name for init in model.graph.initializer}
    for node in model.graph.node:  # in an order onnxruntime can run
        assert set(node.input) <= known
        known |= set(node.output)
    big = products(128, (256, 32))
    i8.rewrite(big), rows.rewrite(big)
    with mock.patch.object(i8, "ROWS_WEIGHT_BYTES", 128 * 256 - 1):  # weights past the core's cache: left
        assert i8.quantize_outputs(big) == 0
    residual = residual_product(64, 64, None)
    i8.rewrite(residual), rows.rewrite(residual)
    assert i8.quantize_outputs(residual) == 0


@amx
@pytest.mark.parametrize("count", [1, 17, 255, 256, 300, 1000])
def test_a_quantized_output_is_quantize_rows_to_the_bit(count):
    """Few rows (the product made whole, then quantized) and many (units of 32 whole rows, a last one short);
    rows of zeros as onnxruntime's nodes answer them, and of NaN as QuantizeRows does."""
    rng = np.random.default_rng(count)
    x = (rng.standard_normal((count, 128)) * np.exp(rng.uniform(-5, 5, (count, 1)))).astype(np.float32)
    x[count // 2] = 0.0
    for gelu in (None, GELUS["com.microsoft"]):
        model = products(128, (128, 64, 40), gelu=gelu)
        ours = rewritten(model)
        assert _ops(ours).count(i8.ROWS_OP) == 2
        assert np.array_equal(run(model, x), run(ours, x, library=True))
    model = products(128, (128, 40))
    x[min(3, count - 1), 7] = np.nan  # QuantizeRows answers NaN for the row (see test_rows): so does the op
    apart = _copy(model)
    i8.rewrite(apart), rows.rewrite(apart)
    theirs, ours = run(apart, x, library=True), run(rewritten(model), x, library=True)
    assert np.array_equal(theirs, ours, equal_nan=True) and np.isnan(ours).any()


@amx
def test_a_row_is_the_same_alone_in_any_batch_and_at_any_thread_count():
    x = np.random.default_rng(1).standard_normal((600, 256)).astype(np.float32)
    model = rewritten(products(256, (320, 64)))
    alone = run(model, x[5:6], library=True)
    for threads in (1, 2, 3):
        assert np.array_equal(run(model, x, threads=threads, library=True)[5:6], alone)


@amx
def test_nan_in_a_row_gives_nan_for_that_row_alone():
    x = np.ones((3, 64), np.float32)
    x[1, 9] = np.nan
    out = run(rewritten(products(64)), x, library=True)
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


def test_what_the_kernel_cannot_compute_alike_is_left_as_it_is():
    assert i8.rewrite(products(100)) == 0  # K not a multiple of the tiles' 64
    model = products(64)
    cast = next(node for node in model.graph.node if node.op_type == "Cast")
    model.graph.output.append(helper.make_tensor_value_info(cast.output[0], TensorProto.FLOAT, None))
    assert i8.rewrite(model) == 0  # another reader of a value within
    fed = products(64)
    weights = next(init for init in fed.graph.initializer if init.data_type == TensorProto.INT8 and init.dims)
    fed.graph.input.append(helper.make_tensor_value_info(weights.name, TensorProto.INT8, list(weights.dims)))
    assert i8.rewrite(fed) == 0  # weights a caller may override


@amx
def test_a_bias_of_one_row_as_a_language_models_logits_bias_is_taken_and_others_are_left():
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    model = products(64, (48,))
    bias = next(init for init in model.graph.initializer if init.name.endswith("_negated"))
    bias.dims[:] = [1, 48]  # [1, N]: broadcast as [N] is
    assert np.array_equal(run(model, x), run(rewritten(model), x, library=True))
    for dims in ([48, 1], [2, 24]):  # not one value per column: the chain ends before it
        other = products(64, (48,))
        bias = next(init for init in other.graph.initializer if init.name.endswith("_negated"))
        bias.dims[:] = dims
        assert i8.rewrite(other) == 1 and "Sub" in _ops(other)


def test_shared_weights_are_packed_once():
    model = products(64, (64, 64), bias=False)
    first, second = [node for node in model.graph.node if node.op_type == "MatMulInteger"]
    second.input[1], second.input[3] = first.input[1], first.input[3]
    scales = [node for node in model.graph.node if node.op_type == "Mul" and node.input[1].endswith("_scale")]
    scales[1].input[1] = scales[0].input[1]
    assert i8.rewrite(model) == 2
    assert sum(init.name.endswith("_i8") for init in model.graph.initializer) == 1


@amx
def test_inputs_that_do_not_fit_the_packed_weights_give_nan_not_a_read_past_them():
    model = rewritten(products(128, (64,), bias=False))
    node = next(node for node in model.graph.node if node.op_type == i8.OP)
    inputs = [helper.make_tensor_value_info("q", TensorProto.UINT8, ["r", "k"]),
              helper.make_tensor_value_info("s", TensorProto.FLOAT, ["r", 1])]
    node.input[:2] = ["q", "s"]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT,
                                                                                 None)],
                              [init for init in model.graph.initializer if init.name in node.input])
    one = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("hotrod", 1)])
    options = ort.SessionOptions()
    native.use_library(options)
    session = ort.InferenceSession(one.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wrong = session.run(None, {"q": np.ones((2, 256), np.uint8), "s": np.ones((2, 1), np.float32)})[0]
    assert wrong.shape == (2, 64) and np.isnan(wrong).all()
    right = session.run(None, {"q": np.ones((2, 128), np.uint8), "s": np.ones((2, 1), np.float32)})[0]
    assert np.isfinite(right).all()


@amx
def test_calls_from_several_threads_at_once_each_get_their_own_answer():
    model = rewritten(products(256, (512, 256)))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    native.use_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(seed).standard_normal((1 + 60 * seed, 256)).astype(np.float32)
              for seed in range(6)]
    alone = [session.run(None, {"x": x})[0] for x in inputs]
    results: dict[int, list[np.ndarray]] = {i: [] for i in range(len(inputs))}
    barrier = threading.Barrier(len(inputs))

    def call(i: int) -> None:
        barrier.wait()
        for _ in range(10):
            results[i].append(session.run(None, {"x": inputs[i]})[0])

    workers = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert all(np.array_equal(out, alone[i]) for i, outs in results.items() for out in outs)


def _forked_model() -> onnx.ModelProto:
    """Int8MatMulRows (with its GELU, at enough rows for its units of whole rows) feeding Int8MatMul."""
    model = rewritten(products(128, (128, 64), gelu=GELUS["com.microsoft"]))
    assert {i8.ROWS_OP, i8.OP} <= set(_ops(model))
    return model


def _forked_run(queue, model, x) -> None:  # noqa: ANN001
    queue.put(run(model(), x, library=True))


def assert_the_same_in_a_forked_process(model, x: np.ndarray) -> None:  # noqa: ANN001
    """`model()`'s answer for `x` the same in a process forked from this one (whose library was loaded already)."""
    here = run(model(), x, library=True)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_forked_run, args=(queue, model, x))
    child.start()
    try:
        there = queue.get(timeout=60)
        child.join(60)
        assert child.exitcode == 0 and np.array_equal(here, there)
    finally:
        child.kill()


@amx
def test_the_op_runs_in_a_forked_process():
    assert_the_same_in_a_forked_process(_forked_model, np.random.default_rng(2).standard_normal((300, 128))
                                        .astype(np.float32))


def test_without_amx_the_graph_is_left_to_onnxruntime(tmp_path, monkeypatch):
    onnx.save(products(64), tmp_path / "int8.onnx")
    monkeypatch.setattr(i8, "available", lambda: False)
    with cpu_kernels.kernel_graph(tmp_path / "int8.onnx", 2) as graph:
        assert graph is None or i8.OP not in graph.ops


def loaded_on_and_off(zoo, tmp_path, name: str, kernel, monkeypatch,  # noqa: ANN001
                      precision: str = "int8") -> tuple:
    """The zoo model `name` built at `precision` and loaded twice: on `kernel`'s op (a module with OP and
    available; every graph must take it) and with the kernel unavailable."""
    out = hotrod.optimize(zoo.checkpoint(name), tmp_path / name, precision=precision, force=True, progress=False,
                          verify_examples=0)
    model = hotrod.load(out)
    assert model.backend.kernel_ops and all(kernel.OP in ops for ops in model.backend.kernel_ops.values())
    monkeypatch.setattr(kernel, "available", lambda: False)
    plain = hotrod.load(out)
    assert not any(kernel.OP in ops for ops in plain.backend.kernel_ops.values())
    return model, plain


@amx
@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_a_loaded_int8_model_multiplies_on_the_kernel_with_the_same_answers(zoo, tmp_path, name, monkeypatch):
    model, plain = loaded_on_and_off(zoo, tmp_path, name, i8, monkeypatch)
    ids, mask = prompt_batch(CASES[name], (5, 3))
    if CASES[name].is_lm:
        assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=6),
                           plain.generate(ids, attention_mask=mask, max_new_tokens=6))
    else:
        assert torch.equal(model(ids, attention_mask=mask).last_hidden_state,
                           plain(ids, attention_mask=mask).last_hidden_state)
