"""hotrod's per-row quantization kernel: the same q and scales as the five nodes it replaces, over odd shapes,
tails and edge values; every row alone the same as in any batch; graphs it cannot take left as they
are; a loaded int8 model's answers unchanged, bit for bit."""

from __future__ import annotations

import multiprocessing

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import hotrod
from hotrod.optimize.quantize import int8_dynamic
from hotrod.runtime import attention, cpu_kernels, native, rows
from tests.zoo import CASES, prompt_batch

library = pytest.mark.skipif(native.library() is None, reason="no kernels' library for this CPU: onnxruntime's ops run")


def products(k: int, widths: tuple[int, ...] = (24,), seed: int = 0) -> onnx.ModelProto:
    """x [rows, k] -> MatMuls one after another, quantized per row as hotrod's int8 build does, with every
    quantized input and scale also a graph output (to compare them)."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "x"
    for i, n in enumerate(widths):
        weights.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.1, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        x, k = f"y{i}", n
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "k"])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], weights)
    model = int8_dynamic(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), per_row=True)
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and any(a.name == "block_size" for a in node.attribute):
            model.graph.output.extend([helper.make_tensor_value_info(node.output[0], TensorProto.UINT8, None),
                                       helper.make_tensor_value_info(node.input[1], TensorProto.FLOAT, None)])
    return model


def run(model: onnx.ModelProto, x: np.ndarray, kernel: bool = False, threads: int = 1) -> list[np.ndarray]:
    model = _copy(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if kernel:
        assert rows.rewrite(model) > 0
        native.use_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def test_each_chain_becomes_one_op_and_its_constants_go():
    model = products(40, (24, 16))
    assert _ops(model).count("Abs") == 2
    rewritten = _copy(model)
    assert rows.rewrite(rewritten) == 2
    ops = _ops(rewritten)
    assert ops.count(rows.OP) == 2 and not {"Abs", "ReduceMax", "QuantizeLinear"} & set(ops)
    assert not {"hotrod_per_row_levels", "hotrod_per_row_huge", "hotrod_per_row_axes"} & {
        init.name for init in rewritten.graph.initializer}
    known = {"x", ""} | {init.name for init in rewritten.graph.initializer}
    for node in rewritten.graph.node:  # in an order onnxruntime can run
        assert set(node.input) <= known
        known |= set(node.output)


@library
@pytest.mark.parametrize("k", [1, 7, 8, 33, 384, 1000])
@pytest.mark.parametrize("count", [1, 3, 130])
def test_the_same_q_and_scales_as_the_nodes(k, count):
    """Odd widths (tails of 1..7 values past a multiple of 8), values on rounding ties, a zero row."""
    rng = np.random.default_rng(k * 1000 + count)
    x = (rng.standard_normal((count, k)) * rng.uniform(0.01, 100, (count, 1))).astype(np.float32)
    x[0, : min(k, 4)] = [1.0, -1.0, 0.5, -2.5][: min(k, 4)]  # scale 2.5 / 127: ties where q is exact
    if count > 2:
        x[1] = 0.0
    model = products(k)
    theirs, ours = run(model, x), run(model, x, kernel=True)
    for a, b in zip(theirs[1:], ours[1:]):  # each quantized input and scale, bit for bit
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert np.array_equal(theirs[0], ours[0])


def _near_ties(top: float, rng: np.random.Generator, k: int = 1024) -> np.ndarray:
    """A row whose maximum is `top` and whose other values lie on and a few ulps around (n + 1/2) * scale:
    the quotients where a multiplication by 1 / scale could round apart from the nodes' division."""
    scale = np.float32(np.float32(top) / np.float32(127.0))
    n = rng.integers(-127, 127, k).astype(np.float32)
    row = (n + np.float32(0.5)) * scale
    for step in range(k):  # 0..3 ulps either way
        for _ in range(int(rng.integers(0, 4))):
            row[step] = np.nextafter(row[step], np.float32(np.inf if step % 2 else -np.inf), dtype=np.float32)
    row = np.clip(row, -np.float32(top), np.float32(top))
    row[rng.integers(0, k)] = np.float32(top)
    return row


@library
def test_the_same_q_as_the_nodes_division_on_and_around_rounding_ties():
    """The kernel multiplies by 1 / scale where no tie is near, and divides where one is: q stays the nodes'
    division's at every scale, from subnormal scales (where it divides throughout) to 1e30 / 127."""
    rng = np.random.default_rng(7)
    tops = [1.0, 2.5, 1e-3, 3.3e5, 1e-30, 1e30, 1.5e-36, 1e-39, 1.17549435e-38 * 127]
    x = np.stack([_near_ties(top, rng) for top in tops for _ in range(8)])
    model = products(x.shape[1])
    theirs, ours = run(model, x), run(model, x, kernel=True)
    for a, b in zip(theirs[1:], ours[1:]):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@library
def test_a_row_is_the_same_alone_in_any_batch_and_at_any_thread_count():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((600, 768)).astype(np.float32)
    model = products(768, (64,))
    alone = run(model, x[5:6], kernel=True)
    for threads in (1, 2, 3):  # onnxruntime's, around the op
        batch = run(model, x, kernel=True, threads=threads)
        assert all(np.array_equal(a[5:6], b) for a, b in zip(batch, alone))


@library
def test_nan_in_a_row_gives_nan_outputs_for_that_row_alone():
    x = np.ones((3, 16), np.float32)
    x[1, 9] = np.nan
    out = run(products(16), x, kernel=True)[0]
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


def test_a_chain_whose_inner_values_another_node_reads_is_left_as_it_is():
    model = products(16)
    absolute = next(node for node in model.graph.node if node.op_type == "Abs")
    model.graph.output.append(helper.make_tensor_value_info(absolute.output[0], TensorProto.FLOAT, None))
    assert rows.rewrite(model) == 0 and "Abs" in _ops(model)


def test_graphs_without_chains_or_without_the_library_are_left_to_onnxruntime(tmp_path, monkeypatch):
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(plain, tmp_path / "plain.onnx")
    onnx.save(products(16), tmp_path / "int8.onnx")
    with cpu_kernels.kernel_graph(tmp_path / "plain.onnx", 2) as rewritten:
        assert rewritten is None
    monkeypatch.setattr(native, "library", lambda: None)
    with cpu_kernels.kernel_graph(tmp_path / "int8.onnx", 2) as rewritten:
        assert rewritten is None


def _forked_run(queue):
    x = np.random.default_rng(2).standard_normal((700, 512)).astype(np.float32)
    queue.put(run(products(512, (32,)), x, kernel=True)[0])


@library
def test_the_op_runs_in_a_forked_process():
    """A server forks workers: a child process runs the op as its parent does."""
    x = np.random.default_rng(2).standard_normal((700, 512)).astype(np.float32)
    here = run(products(512, (32,)), x, kernel=True)[0]
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_forked_run, args=(queue,))
    child.start()
    there = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and np.array_equal(here, there)


@library
@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_a_loaded_int8_model_quantizes_on_the_kernel_with_the_same_answers(zoo, tmp_path, name, monkeypatch):
    out = hotrod.optimize(zoo.checkpoint(name), tmp_path / name, precision="int8", force=True, progress=False,
                          verify_examples=0)
    monkeypatch.setattr(attention, "available", lambda: False)  # bf16 attention changes the answers
    model = hotrod.load(out)
    assert all(rows.OP in ops for ops in model.backend.kernel_ops.values()) and model.backend.kernel_ops
    monkeypatch.setattr(native, "library", lambda: None)
    theirs = hotrod.load(out)
    assert not theirs.backend.kernel_ops
    ids, mask = prompt_batch(CASES[name], (5, 3))
    if CASES[name].is_lm:
        assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=6),
                           theirs.generate(ids, attention_mask=mask, max_new_tokens=6))
    else:
        ours, reference = model(ids, attention_mask=mask), theirs(ids, attention_mask=mask)
        assert torch.equal(ours.last_hidden_state, reference.last_hidden_state)
