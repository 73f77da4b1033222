"""hotrod's int4 kernel: the same products as onnxruntime's MatMulNBits (int8 compute), every row alone
the same as in any batch, at any split between threads, and graphs it cannot run left as they are."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import hotrod
from hotrod.optimize.quantize import weight_only
from hotrod.runtime import cpu_kernels, native, q4
from tests.zoo import CASES, prompt_batch


def _cpu_widths() -> list[int]:
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    return [width for width, needed in q4.BUILDS.items() if all(flag in flags for flag in needed)]


WIDTHS = _cpu_widths()  # the kernel's builds this CPU runs
kernel = pytest.mark.skipif(not WIDTHS, reason="this CPU lacks AVX2: MatMulNBits runs")


def chain(shapes: list[tuple[int, int]], bits: int = 4, block: int = 256, seed: int = 0) -> onnx.ModelProto:
    """MatMuls one after another (float weights), lowered as hotrod lowers a graph to int4/int8 weights."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "x"
    for i, (k, n) in enumerate(shapes):
        weights.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.05, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        x = f"y{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", shapes[0][0]])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return weight_only(model, bits, block)


def session(model: onnx.ModelProto, kernel_threads: int | None = None,
            width: int | None = None) -> ort.InferenceSession:
    """onnxruntime's session of `model` at one thread; with `kernel_threads`, of a copy rewritten for the kernel
    (its build of `width`, the widest this CPU runs where none is named)."""
    if kernel_threads is None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    model = _copy(model)
    assert q4.rewrite(model, kernel_threads, width) > 0
    return kernel_session(model, kernel_threads)


def kernel_session(model: onnx.ModelProto, threads: int = 2) -> ort.InferenceSession:
    """A session of `model` (rewritten already) with the kernel's library, on `threads` of onnxruntime's, as
    the backend makes one."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    native.use_library(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def with_bias(model: onnx.ModelProto, seed: int = 3) -> onnx.ModelProto:
    """`model` with a bias on each MatMulNBits (its sixth input), as GPT-2's projections carry theirs."""
    rng = np.random.default_rng(seed)
    for node in model.graph.node:
        n = next(a.i for a in node.attribute if a.name == "N")
        name = f"{node.output[0]}_bias"
        model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), name))
        node.input.extend([""] * (5 - len(node.input)) + [name])
    return model


# (K, N, block, rows): a decoding step's shapes, an lm head, N not a multiple of the kernel's 64 columns,
# K shorter than a block (padded, as MatMulNBits pads it), smaller blocks, rows past the kernel's 4 a tile
SHAPES = [(512, 2048, 256, 1), (2048, 512, 256, 3), (512, 32128, 256, 2), (768, 1000, 256, 5), (32, 100, 256, 6),
          (64, 50, 32, 7), (512, 1536, 128, 9)]


@kernel
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(("k", "n", "block", "rows"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_computes_what_matmulnbits_computes(k, n, block, rows, bias, width):
    model = chain([(k, n)], block=block, seed=k + n)
    model = with_bias(model) if bias else model
    x = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
    theirs = session(model).run(None, {"x": x})[0]
    ours = session(model, kernel_threads=2, width=width).run(None, {"x": x})[0]
    assert ours.shape == theirs.shape == (rows, n)
    # the same int8 and int32 arithmetic; only the float sums of a block's scaled parts may round apart
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * float(np.abs(theirs).max()))


@pytest.mark.skipif(len(WIDTHS) < 2, reason="this CPU runs one build of the kernel")
@pytest.mark.parametrize(("k", "n", "block", "rows"), SHAPES)
def test_every_build_gives_the_same_answers(k, n, block, rows):
    model = with_bias(chain([(k, n)], block=block, seed=k + n))
    x = np.random.default_rng(5).standard_normal((rows, k)).astype(np.float32)
    answers = [session(model, kernel_threads=2, width=width).run(None, {"x": x})[0] for width in WIDTHS]
    assert all(np.array_equal(answer, answers[0]) for answer in answers[1:])


@kernel
def test_a_build_this_cpu_cannot_run_gives_nan_not_a_fault():
    with pytest.raises(ValueError, match="width 128"):
        q4.rewrite(chain([(256, 128)]), 2, width=128)
    model = chain([(256, 128)])
    q4.rewrite(model, 2)
    next(a for a in model.graph.node[0].attribute if a.name == "width").i = 384  # no such build
    assert np.isnan(kernel_session(model).run(None, {"x": np.ones((2, 256), np.float32)})[0]).all()


@kernel
@pytest.mark.parametrize("width", WIDTHS)
def test_a_row_is_the_same_alone_in_any_batch_and_at_any_thread_count(width):
    model = with_bias(chain([(512, 1536), (1536, 512), (512, 2048), (2048, 512), (512, 3000)]))
    x = np.random.default_rng(2).standard_normal((9, 512)).astype(np.float32)
    batched = session(model, kernel_threads=2, width=width).run(None, {"x": x})[0]
    for threads in (1, 2, 3):
        run = session(model, kernel_threads=threads, width=width)
        for row in range(9):
            assert np.array_equal(run.run(None, {"x": x[row:row + 1]})[0][0], batched[row])
        assert np.array_equal(run.run(None, {"x": x[3:8]})[0], batched[3:8])


@kernel
def test_calls_from_several_threads_at_once_each_get_their_own_answer():
    model = chain([(512, 2048), (2048, 512), (512, 4096)])
    run = session(model, kernel_threads=2)
    inputs = [np.random.default_rng(seed).standard_normal((1 + seed % 3, 512)).astype(np.float32)
              for seed in range(8)]
    alone = [run.run(None, {"x": x})[0] for x in inputs]
    results: dict[int, list[np.ndarray]] = {i: [] for i in range(len(inputs))}
    barrier = threading.Barrier(len(inputs))

    def call(i: int) -> None:
        barrier.wait()
        for _ in range(20):
            results[i].append(run.run(None, {"x": inputs[i]})[0])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, outs in results.items():
        assert all(np.array_equal(out, alone[i]) for out in outs)


def _run_in_child(queue) -> None:  # noqa: ANN001
    model = chain([(512, 2048), (2048, 512)])
    x = np.ones((1, 512), np.float32)
    queue.put(session(model, kernel_threads=2).run(None, {"x": x})[0].tolist())


@kernel
def test_a_forked_child_runs_the_kernel_as_its_parent_did():
    model = chain([(512, 2048), (2048, 512)])
    x = np.ones((1, 512), np.float32)
    expected = session(model, kernel_threads=2).run(None, {"x": x})[0].tolist()  # buffers and threads made here
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_run_in_child, args=(queue,))
    child.start()
    try:
        child.join(timeout=60)
        assert child.exitcode == 0, "the child hung or failed on what its parent left"
        assert queue.get(timeout=5) == expected
    finally:
        child.kill()


def test_only_what_the_kernel_computes_alike_is_rewritten():
    int8 = chain([(512, 512)], bits=8)
    assert q4.rewrite(_copy(int8), 2) == 0  # 8-bit weights: MatMulNBits' own path
    low_accuracy = chain([(512, 512)])
    for node in low_accuracy.graph.node:
        for attr in node.attribute:
            if attr.name == "accuracy_level":
                attr.i = 1  # fp32 compute: another result than the kernel's int8
    assert q4.rewrite(_copy(low_accuracy), 2) == 0
    wide_blocks = chain([(1024, 256)])
    next(a for a in wide_blocks.graph.node[0].attribute if a.name == "block_size").i = 512  # as imported graphs may
    assert q4.rewrite(_copy(wide_blocks), 2) == 0  # past 256, MatMulNBits' activations are not per block
    both = with_bias(chain([(512, 512), (512, 256)]))
    rewritten = _copy(both)
    assert q4.rewrite(rewritten, 2) == 2
    assert [n.op_type for n in rewritten.graph.node] == ["Q4MatMul", "Q4MatMul"]
    names = {init.name for init in rewritten.graph.initializer}
    assert not any(name in names for node in both.graph.node for name in node.input[1:] if name)  # old ones gone
    assert any(o.domain == q4.DOMAIN for o in rewritten.opset_import)


def test_graphs_without_int4_products_or_without_the_kernel_are_left_to_onnxruntime(tmp_path, monkeypatch):
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(plain, tmp_path / "plain.onnx")
    onnx.save(chain([(512, 512)]), tmp_path / "int4.onnx")
    with cpu_kernels.kernel_graph(tmp_path / "plain.onnx", 2) as rewritten:
        assert rewritten is None
    monkeypatch.setattr(q4, "library", lambda: None)
    with cpu_kernels.kernel_graph(tmp_path / "int4.onnx", 2) as rewritten:
        assert rewritten is None


@kernel
def test_a_loaded_int4_model_runs_its_graphs_on_the_kernel(zoo, tmp_path):
    assert q4.library() is not None, "the kernel library is missing: `make native` builds it"
    for name in ("gpt2", "t5_v1_1"):
        out = hotrod.optimize(zoo.checkpoint(name), tmp_path / name, precision="int4-b256", force=True)
        model = hotrod.load(out)
        assert model.backend.kernel_graphs == set(model.backend.sessions)
        ids, mask = prompt_batch(CASES[name], (5, 3))
        ours = model.generate(ids, attention_mask=mask, max_new_tokens=6)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(q4, "library", lambda: None)
            theirs = hotrod.load(out)
        assert not theirs.backend.kernel_graphs
        assert torch.equal(ours, theirs.generate(ids, attention_mask=mask, max_new_tokens=6))


@kernel
def test_a_product_the_kernel_cannot_compute_alike_stays_on_matmulnbits_beside_it(tmp_path):
    model = chain([(512, 512), (512, 256)])
    model.graph.node[1].attribute[[a.name for a in model.graph.node[1].attribute].index("accuracy_level")].i = 1
    onnx.save(model, tmp_path / "mixed.onnx")
    x = np.random.default_rng(6).standard_normal((3, 512)).astype(np.float32)
    with cpu_kernels.kernel_graph(tmp_path / "mixed.onnx", 2) as rewritten:
        assert rewritten is not None and rewritten.ops == {q4.OP}
        graph = onnx.load(rewritten.path)
        assert [node.op_type for node in graph.graph.node] == [q4.OP, "MatMulNBits"]
        ours = ort.InferenceSession(str(rewritten.path), rewritten.options(ort.SessionOptions()),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    theirs = session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * float(np.abs(theirs).max()))


@kernel
def test_the_rewritten_graph_is_a_file_of_no_folder(tmp_path, monkeypatch):
    onnx.save(chain([(512, 512)]), tmp_path / "int4.onnx")
    monkeypatch.setattr(native.tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    with cpu_kernels.kernel_graph(tmp_path / "int4.onnx", 2) as rewritten:
        assert [node.op_type for node in onnx.load(str(rewritten.path)).graph.node] == ["Q4MatMul"]
        assert not list((tmp_path / "temp").iterdir())  # a process killed now leaves nothing
    assert [node.op_type for node in onnx.load(str(tmp_path / "int4.onnx")).graph.node] == ["MatMulNBits"]


@kernel
def test_no_room_for_the_rewritten_graph_leaves_it_to_onnxruntime(tmp_path, monkeypatch):
    onnx.save(chain([(512, 512)]), tmp_path / "int4.onnx")
    monkeypatch.setattr(native.tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(native.tempfile, "TemporaryFile", full)
    with cpu_kernels.kernel_graph(tmp_path / "int4.onnx", 2) as rewritten:
        assert rewritten is None
    assert not list((tmp_path / "temp").iterdir())


@kernel
def test_inputs_that_do_not_fit_the_packed_weights_give_nan_not_a_read_past_them():
    model = chain([(256, 128)])
    q4.rewrite(model, 2)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "k"  # let a wrong K through
    run = kernel_session(model)
    assert np.isnan(run.run(None, {"x": np.ones((2, 1024), np.float32)})[0]).all()
    assert np.isfinite(run.run(None, {"x": np.ones((2, 256), np.float32)})[0]).all()


@kernel
def test_shared_weights_are_packed_once_and_fed_or_returned_ones_kept():
    model = chain([(512, 512), (512, 512)])
    second = model.graph.node[1]
    second.input[1], second.input[2] = model.graph.node[0].input[1], model.graph.node[0].input[2]  # shared
    used = {name for node in model.graph.node for name in node.input}
    kept = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    x = np.random.default_rng(4).standard_normal((3, 512)).astype(np.float32)
    theirs = session(model).run(None, {"x": x})[0]
    rewritten = _copy(model)
    assert q4.rewrite(rewritten, 2) == 2
    assert len(rewritten.graph.initializer) == 3  # one packed weight, scale and bias for both
    np.testing.assert_allclose(kernel_session(rewritten).run(None, {"x": x})[0], theirs, rtol=1e-5, atol=1e-5 * float(np.abs(theirs).max()))

    fed = chain([(512, 512)])
    scales = fed.graph.node[0].input[2]
    fed.graph.input.append(helper.make_tensor_value_info(scales, TensorProto.FLOAT, None))
    assert q4.rewrite(_copy(fed), 2) == 0  # a caller may feed its own scales: the node is left as it is
    returned = chain([(512, 512)])
    weights = returned.graph.node[0].input[1]
    returned.graph.output.append(helper.make_tensor_value_info(weights, TensorProto.UINT8, None))
    out = _copy(returned)
    assert q4.rewrite(out, 2) == 1 and weights in {init.name for init in out.graph.initializer}


def test_an_empty_graph_file_is_left_to_onnxruntime_to_refuse(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    with cpu_kernels.kernel_graph(tmp_path / "empty.onnx", 2) as rewritten:
        assert rewritten is None
