"""hotrod's bf16 product kernel (AMX-BF16): products of operands rounded to bf16 with fp32 sums, over odd shapes,
tails and thread counts; every row alone the same as in any batch, bit for bit; only graphs whose build asked for
it, and only what it computes alike, rewritten; a fallback wherever the CPU or the build lacks it; a loaded
bf16-products model's answers those of fp32 within bf16's rounding."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from hotrod.asks import PRODUCTS_KEY, ask
from hotrod.runtime import attention, bf16, cpu_kernels, native, norm
from tests.runtime.test_i8 import (
    GELUS,
    assert_the_same_in_a_forked_process,
    float_products,
    loaded_on_and_off,
    run,
    run_all,
)
from tests.runtime.test_rows import _copy, _ops
from tests.zoo import CASES, prompt_batch

pytestmark = pytest.mark.usefixtures("products_path")  # tests/runtime/conftest.py: each product path

amx = pytest.mark.skipif(not bf16.available(), reason="no AMX-BF16 on this CPU (or no tile state): fp32 runs")


def products(k: int, widths: tuple[int, ...] = (96,), bias: bool = True, seed: int = 0, gelu: dict | None = None,
             asked: bool = True) -> tuple[onnx.ModelProto, list[tuple[np.ndarray, np.ndarray | None]]]:
    """x [rows, k] -> MatMul (+ bias) (-> Gelu) one after another in fp32 (`float_products`), asking for bf16
    products (where `asked`); and each product's weights and bias."""
    model = float_products(k, widths, bias, seed, gelu)
    arrays = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    weights = [(arrays[f"w{i}"], arrays.get(f"b{i}")) for i in range(len(widths))]
    return (ask(model, PRODUCTS_KEY, "bf16") if asked else model), weights


def rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    out = _copy(model)
    assert bf16.rewrite(out) > 0
    return out


def rounded(values: np.ndarray) -> np.ndarray:
    """`values` rounded to bf16 (to nearest even) and back."""
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


def emulated(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """The product of the operands rounded to bf16, summed in float64: what the kernel's fp32 sums approach."""
    y = rounded(x).astype(np.float64) @ rounded(w).astype(np.float64)
    return y + (0 if b is None else b)


def assert_sums_close(y: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> None:
    """Within fp32's rounding of sums of bf16 products: a few units of 2^-24 of the sum of the terms' sizes."""
    bound = 8 * 2.0 ** -24 * (np.abs(rounded(x)) @ np.abs(rounded(w)) + (0 if b is None else np.abs(b))) + 1e-30
    assert np.all(np.abs(y - emulated(x, w, b)) <= bound * x.shape[-1] ** 0.5)


def test_each_product_chain_becomes_one_op_and_the_weights_go_packed():
    model, _ = products(64, (96, 40), gelu=GELUS["com.microsoft"])
    out = _copy(model)
    assert bf16.rewrite(out) == 2
    assert _ops(out) == [bf16.OP, bf16.OP]
    assert [helper.get_attribute_value(a) for a in out.graph.node[0].attribute if a.name == "activation"] == [bf16.GELU]
    names = {init.name for init in out.graph.initializer}
    assert not names & {"w0", "w1", "b0", "b1"}  # the fp32 weights gone: only the packed ones are read
    packed = next(init for init in out.graph.initializer if init.name == out.graph.node[0].input[1])
    assert packed.data_type == TensorProto.BFLOAT16 and list(packed.dims) == [3, 2, 1024]


def test_a_graph_whose_build_did_not_ask_is_left_as_it_is():
    model, _ = products(64, asked=False)
    out = _copy(model)
    assert bf16.rewrite(out) == 0 and out == model


def test_the_packed_layout_is_the_tiles():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((70, 45)).astype(np.float32)
    packed, bias = bf16.pack(w, np.arange(45, dtype=np.float32))
    assert packed.shape == (2, 3, 1024) and bias.shape == (64,) and bias[44] == 44 and not bias[45:].any()
    values = packed.astype(np.float32)
    for b, d, h, r, c, j in [(0, 0, 0, 0, 0, 0), (1, 2, 0, 2, 12, 1), (0, 1, 1, 15, 15, 1), (1, 0, 1, 3, 4, 0)]:
        row, col = 32 * d + 2 * r + j, 32 * b + 16 * h + c
        expected = rounded(w[row:row + 1, col:col + 1])[0, 0] if row < 70 and col < 45 else 0.0
        assert values[b, d, 512 * h + 32 * r + 2 * c + j] == expected


@amx
# 4100: deeper than a unit's rows take at once, so its depth goes through in chunks
@pytest.mark.parametrize("k, n", [(64, 96), (37, 45), (1, 16), (384, 1152), (1000, 33), (4100, 40)])
@pytest.mark.parametrize("count", [1, 15, 16, 33, 300])
def test_the_sums_are_of_bf16_operands_in_fp32(k, n, count):
    model, [(w, b)] = products(k, (n,))
    x = np.random.default_rng(count).standard_normal((count, k)).astype(np.float32)
    for threads in (1, 2):
        assert_sums_close(run(rewritten(model), x, threads, library=True), x, w, b)


@amx
def test_the_answers_are_fp32s_within_bf16s_rounding():
    model, _ = products(256, (128,))
    x = np.random.default_rng(3).standard_normal((50, 256)).astype(np.float32)
    ours, theirs = run(rewritten(model), x, library=True), run(model, x)
    assert 0 < np.abs(ours - theirs).max() <= 2 ** -7 * np.abs(theirs).max()


@amx
@pytest.mark.parametrize("gelu", list(GELUS))
def test_a_gelu_after_a_product_goes_into_its_epilogue(gelu):
    model, [(w, b)] = products(96, (80,), gelu=GELUS[gelu])
    x = np.random.default_rng(4).standard_normal((40, 96)).astype(np.float32)
    out = rewritten(model)
    assert _ops(out) == [bf16.OP]
    plain = _copy(model)  # the graph's own Gelu on the kernel's sums
    plain.graph.output[0].name = plain.graph.node[-2].output[0]
    del plain.graph.node[-1]
    sums = run(rewritten(plain), x, library=True)
    gelu_of_sums = run(_gelu_only(GELUS[gelu]), sums)
    assert np.array_equal(run(out, x, library=True), gelu_of_sums)


def _gelu_only(attributes: dict) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], **attributes)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])


def residual_product(k: int, n: int, shape: tuple | None = None, split: bool = False) -> onnx.ModelProto:
    """x [rows, k] -> MatMul + bias, then + r (of `shape`, the product's where None) or a three-way Split."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])]
    outputs = ["s"]
    if split:
        nodes.append(helper.make_node("Split", ["y"], ["q", "kk", "v"], axis=-1, num_outputs=3))
        outputs = ["q", "kk", "v"]
    else:
        nodes.append(helper.make_node("Add", ["y", "r"], ["s"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, shape or ["rows", n]))
    weights = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.1, "w"),
               numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outputs], weights)
    return ask(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), PRODUCTS_KEY, "bf16")


@amx
@pytest.mark.parametrize("shape", [None, (1, 48), (48,), (7, 1)])
def test_a_residual_added_after_a_product_goes_into_the_op(shape):
    model = residual_product(64, 48, shape)
    out = rewritten(model)
    assert _ops(out) == [bf16.OP] and len(out.graph.node[0].input) == 4
    rng = np.random.default_rng(6)
    x = rng.standard_normal((7, 64)).astype(np.float32)
    r = rng.standard_normal(shape or (7, 48)).astype(np.float32)
    plain = _copy(model)  # the product on the kernel, then onnxruntime's Add
    plain.graph.output[0].name = "y"
    del plain.graph.node[-1]
    del plain.graph.input[1]
    sums = run(rewritten(plain), x, library=True)
    assert np.array_equal(run_all(out, {"x": x, "r": r}, library=True)[0], sums + r)


@amx
def test_a_fused_qkv_products_split_goes_into_the_op():
    model = residual_product(64, 96, split=True)
    out = rewritten(model)
    assert _ops(out) == [bf16.SPLIT_OP]
    x = np.random.default_rng(7).standard_normal((20, 64)).astype(np.float32)
    whole = residual_product(64, 96, split=True)
    del whole.graph.node[-1]
    whole.graph.output[0].name = "y"
    del whole.graph.output[1:]
    y = run(rewritten(whole), x, library=True)
    parts = run_all(out, x, library=True)
    assert all(np.array_equal(part, y[:, 32 * i:32 * (i + 1)]) for i, part in enumerate(parts))


@amx
def test_a_row_is_the_same_alone_in_any_batch_and_at_any_thread_count():
    model, _ = products(2200, (300, 70), gelu=GELUS["onnx"])  # the first product's depth in two chunks
    out = rewritten(model)
    x = np.random.default_rng(8).standard_normal((333, 2200)).astype(np.float32)
    batch = run(out, x, 2, library=True)
    for index, count, threads in [(0, 1, 1), (17, 1, 2), (100, 16, 2), (300, 33, 1), (5, 300, 2)]:
        assert np.array_equal(run(out, x[index:index + count], threads, library=True), batch[index:index + count])


@amx
@pytest.mark.parametrize("count", [1, 15, 33, 300])
def test_a_product_read_only_by_the_next_rounds_its_output_itself_to_the_same_bits(count):
    model, _ = products(64, (96, 128, 40), gelu=GELUS["com.microsoft"])
    out = rewritten(model)
    plain = _copy(out)
    assert bf16.round_outputs(out) == 2 and _ops(out) == [bf16.ROUNDED_OP, bf16.ROUNDED_OP, bf16.OP]
    x = np.random.default_rng(count).standard_normal((count, 64)).astype(np.float32)
    for threads in (1, 2):
        assert np.array_equal(run(out, x, threads, library=True), run(plain, x, threads, library=True))


def test_only_a_product_whose_one_reader_is_a_bf16_products_rows_rounds_its_output():
    model, _ = products(64, (40, 64, 64))  # 40 columns: not the tiles' depth step
    model.graph.output.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, None))  # a graph output
    out = rewritten(model)
    assert bf16.round_outputs(out) == 0
    read_twice, _ = products(64, (64, 64))
    read_twice.graph.node.append(helper.make_node("Relu", ["y0"], ["r"]))
    read_twice.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    assert bf16.round_outputs(rewritten(read_twice)) == 0


def normed_product(k: int, n: int) -> onnx.ModelProto:
    """x [rows, k] -> LayerNormalization -> MatMul + bias, plus the normalized rows (a residual), asking for bf16
    products."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "be"], ["h"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["h", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"]),
             helper.make_node("Add", ["y", "h"], ["s"])]
    weights = [numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "g"),
               numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "be"),
               numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.1, "w"),
               numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)], weights)
    return ask(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), PRODUCTS_KEY, "bf16")


@amx
@pytest.mark.parametrize("count", [1, 15, 33, 300])
def test_a_layer_norm_read_by_a_bf16_product_rounds_its_rows_for_it_to_the_same_bits(count):
    out = rewritten(normed_product(96, 96))
    plain = _copy(out)
    assert norm.rewrite(out) == 1
    assert _ops(out) == [norm.ROUNDED_OP, bf16.OP] and out.graph.node[1].input[0] == out.graph.node[0].output[1]
    assert out.graph.node[1].input[3] == out.graph.node[0].output[0]  # the residual reads the floats
    x = (np.random.default_rng(count).standard_normal((count, 96)) * 3 + 1).astype(np.float32)
    assert np.array_equal(run(out, x, library=True), run(plain, x, library=True))


def test_a_layer_norm_whose_gamma_a_caller_may_feed_is_rewritten_without_failing():
    model = rewritten(normed_product(96, 96))
    model.graph.input.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [96]))
    norm.rewrite(model)
    assert [node.op_type for node in model.graph.node][-1] == bf16.OP


@amx
def test_a_float_type_said_of_a_rounded_output_goes_with_it():
    model, _ = products(64, (96, 64))
    model.graph.value_info.append(helper.make_tensor_value_info("y0", TensorProto.FLOAT, ["rows", 96]))
    out = rewritten(model)
    assert bf16.round_outputs(out) == 1 and not any(info.name == "y0" for info in out.graph.value_info)
    x = np.random.default_rng(10).standard_normal((5, 64)).astype(np.float32)
    assert np.isfinite(run(out, x, library=True)).all()


def test_a_layer_norm_whose_width_is_not_the_tiles_depth_step_stays_plain():
    out = rewritten(normed_product(40, 64))
    if norm.rewrite(out):
        assert _ops(out)[0] == norm.OP


@amx
def test_shared_weights_are_packed_once():
    model, _ = products(64, (64,), bias=False)
    model.graph.node.append(helper.make_node("MatMul", ["y0", "w0"], ["z"]))
    model.graph.output[0].name = "z"
    out = rewritten(model)
    assert _ops(out) == [bf16.OP, bf16.OP]
    assert sum(init.name.endswith("_bf16") for init in out.graph.initializer) == 1


def test_what_the_kernel_cannot_compute_alike_is_left_as_it_is():
    model, _ = products(64)
    model.graph.input.append(helper.make_tensor_value_info("w0", TensorProto.FLOAT, [64, 96]))  # a caller may feed
    assert bf16.rewrite(_copy(model)) == 0
    half, _ = products(64)
    half.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.zeros((64, 96), np.float16), "w0"))
    assert bf16.rewrite(_copy(half)) == 0


@amx
def test_inputs_that_do_not_fit_the_packed_weights_give_nan_not_a_read_past_them():
    model, _ = products(128, (64,), bias=False)
    out = rewritten(model)
    wrong = run(out, np.ones((2, 256), np.float32), library=True)
    assert wrong.shape == (2, 64) and np.isnan(wrong).all()
    assert np.isfinite(run(out, np.ones((2, 128), np.float32), library=True)).all()


def _forked_model() -> onnx.ModelProto:
    return rewritten(products(128, (128, 64), gelu=GELUS["com.microsoft"])[0])


@amx
def test_the_op_runs_in_a_forked_process():
    assert_the_same_in_a_forked_process(_forked_model, np.random.default_rng(2).standard_normal((300, 128))
                                        .astype(np.float32))


def test_without_amx_bf16_the_graph_is_left_to_onnxruntime(tmp_path, monkeypatch):
    onnx.save(products(64)[0], tmp_path / "bf16.onnx")
    monkeypatch.setattr(bf16, "available", lambda: False)
    with cpu_kernels.kernel_graph(tmp_path / "bf16.onnx", 2) as graph:
        assert graph is None or bf16.OP not in graph.ops


@amx
@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_a_loaded_bf16_products_model_multiplies_on_the_kernel_within_bf16s_rounding(zoo, tmp_path, name, monkeypatch):
    model, plain = loaded_on_and_off(zoo, tmp_path, name, bf16, monkeypatch, precision="bf16-products")
    ids, mask = prompt_batch(CASES[name], (5, 3))
    if CASES[name].is_lm:
        assert model.generate(ids, attention_mask=mask, max_new_tokens=6).shape == \
            plain.generate(ids, attention_mask=mask, max_new_tokens=6).shape
        return
    # its attention on the tiles too, where there are tiles, reading the keys and values the fused Q/K/V product
    # split
    assert all((attention.OP in ops) == attention.available() for ops in model.backend.kernel_ops.values())
    ours, theirs = (m(ids, attention_mask=mask).last_hidden_state for m in (model, plain))
    assert not torch.equal(ours, theirs) and torch.allclose(ours, theirs, rtol=0.05, atol=0.05)
    alone = model(ids[1:2, :3], attention_mask=mask[1:2, :3]).last_hidden_state
    assert torch.equal(alone, ours[1:2, :3])


def test_the_library_has_the_op_wherever_it_is_built():
    library = native.library()
    if library is None:
        pytest.skip("no library for this CPU")
    options = ort.SessionOptions()
    native.use_library(options)
    model, _ = products(64)
    out = _copy(model)
    out.graph.node[0].CopyFrom(helper.make_node(bf16.OP, ["x", "p", "q"], ["y0"], domain=native.DOMAIN, N=96))
    del out.graph.node[1:]
    out.graph.initializer.extend([numpy_helper.from_array(bf16.pack(np.zeros((64, 96), np.float32), None)[0], "p"),
                                  numpy_helper.from_array(np.zeros(96, np.float32), "q")])
    native.add_domain(out)
    ort.InferenceSession(out.SerializeToString(), options, providers=["CPUExecutionProvider"])
