"""Static QDQ int8 and int8 weight-only quantization, graph by graph, on the tiny models.

Each precision's `lower` is tested where it works: an fp32 graph of an artifact in, a quantized graph out, run with
onnxruntime on feeds recorded from the fp32 model (calibrated on half of the built-in calibration texts,
judged on the other half).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hotrod import precisions
from hotrod.errors import HotrodError
from hotrod.export import onnx as exporter
from hotrod.optimize import quantize
from hotrod.optimize.calibration import capture_feeds
from hotrod.optimize.quantize import MAX_CALIBRATION_FEEDS
from hotrod.options import CALIBRATION_METHODS
from hotrod.verification.inputs import builtin_texts

CASES = ("gpt2", "t5", "bert")
# Cosine of the first output (logits / hidden states) to fp32 over the held-out feeds, on these random
# tiny models: static int8 lands at 0.997-0.99999 (entropy is the loosest), int8 weight-only at >= 0.9999.
MIN_COSINE = {"int8-static": 0.99, "int8-weight": 0.999}
QUANTIZED_KERNELS = {"MatMulIntegerToFloat", "QLinearMatMul", "QGemm"}


@pytest.fixture(scope="module")
def feeds(zoo):
    """case -> (calibration feeds, held-out feeds), each {graph name: [feed dicts]}, recorded once."""
    texts, recorded = builtin_texts(), {}

    def get(case: str):
        if case not in recorded:
            model = zoo.model(case, "onnxruntime")
            recorded[case] = (capture_feeds(model, texts[::2], per_graph=16),
                              capture_feeds(model, texts[1::2], per_graph=6))
        return recorded[case]

    return get


def lower(model: onnx.ModelProto, precision: str, feeds: list[dict] | None = None,
          method: str = "minmax") -> onnx.ModelProto:
    """`model` lowered to `precision` through the registry, as the build does it."""
    return precisions.get(precision).lower(model, feeds, method)[0]


def graphs(artifact: Path) -> dict[str, onnx.ModelProto]:
    return {path.stem: onnx.load(str(path)) for path in sorted(artifact.glob("*.onnx"))}


def run(model: onnx.ModelProto, feeds: list[dict], optimized: Path | None = None) -> list[list[np.ndarray]]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if optimized is not None:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(optimized)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in feeds]


def cosine(reference: list[list[np.ndarray]], actual: list[list[np.ndarray]]) -> float:
    a = np.concatenate([outputs[0].ravel() for outputs in reference]).astype(np.float64)
    b = np.concatenate([outputs[0].ravel() for outputs in actual]).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def weight_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    weights = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    return [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {output: node for node in model.graph.node for output in node.output}


def check_outputs_kept(fp32: onnx.ModelProto, quantized: onnx.ModelProto, reference, actual) -> None:
    """Same outputs, all fp32, none produced by a DequantizeLinear, and quantization did change them."""
    assert [o.name for o in quantized.graph.output] == [o.name for o in fp32.graph.output]
    made_by = producers(quantized)
    assert all(made_by[o.name].op_type != "DequantizeLinear" for o in quantized.graph.output)
    for ref, out in zip(reference, actual):
        assert [o.dtype for o in out] == [np.float32] * len(ref)
        assert [o.shape for o in out] == [r.shape for r in ref]
    assert any(not np.array_equal(r[0], o[0]) for r, o in zip(reference, actual)), "quantization changed nothing"


@pytest.mark.parametrize("method", CALIBRATION_METHODS)
@pytest.mark.parametrize("case_name", CASES)
def test_int8_static_quantizes_every_weight_and_stays_close(zoo, feeds, case_name, method):
    calibration, held_out = feeds(case_name)
    for name, fp32 in graphs(zoo.artifact(case_name)).items():
        expected = len(weight_ops(fp32))
        quantized = lower(graphs(zoo.artifact(case_name))[name], "int8-static", calibration[name], method)
        ops = [node.op_type for node in quantized.graph.node]
        assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
        assert "Identity" not in ops  # the isolating copies are gone
        # Every MatMul / Gemm with a weight reads int8 weights and a quantized activation; none was skipped.
        made_by = producers(quantized)
        int8 = {t.name for t in quantized.graph.initializer if t.data_type == onnx.TensorProto.INT8}
        read_quantized = [node for node in quantized.graph.node if node.op_type in ("MatMul", "Gemm")
                          and made_by.get(node.input[0]) is not None
                          and made_by[node.input[0]].op_type == "DequantizeLinear"
                          and made_by.get(node.input[1]) is not None
                          and made_by[node.input[1]].input[0] in int8]
        assert len(read_quantized) == expected > 0, name
        reference, actual = run(fp32, held_out[name]), run(quantized, held_out[name])
        check_outputs_kept(fp32, quantized, reference, actual)
        assert cosine(reference, actual) >= MIN_COSINE["int8-static"], (name, cosine(reference, actual))


@pytest.mark.parametrize("case_name", CASES)
def test_int8_static_runs_as_integer_kernels_and_leaves_the_rest_fp32(zoo, feeds, case_name, tmp_path):
    """After ORT's graph optimization every quantized MatMul / Gemm is an integer kernel."""
    calibration, held_out = feeds(case_name)
    for name, fp32 in graphs(zoo.artifact(case_name)).items():
        quantized = lower(graphs(zoo.artifact(case_name))[name], "int8-static", calibration[name])
        dequantized = {node.output[0] for node in quantized.graph.node if node.op_type == "DequantizeLinear"}
        for node in quantized.graph.node:  # the residual stream and fused ops read fp32 tensors
            if node.op_type not in ("MatMul", "Gemm", "DequantizeLinear"):
                assert not dequantized & set(node.input), (name, node.name)
        run(quantized, held_out[name][:1], optimized=tmp_path / f"{name}.onnx")
        ops = [node.op_type for node in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node]
        assert sum(op in QUANTIZED_KERNELS for op in ops) == len(weight_ops(fp32)), (name, ops)


@pytest.mark.parametrize("case_name", CASES)
def test_int8_weight_is_8_bit_matmul_nbits(zoo, feeds, case_name):
    _, held_out = feeds(case_name)
    for name, fp32 in graphs(zoo.artifact(case_name)).items():
        quantized = lower(graphs(zoo.artifact(case_name))[name], "int8-weight")
        nbits = [node for node in quantized.graph.node if node.op_type == "MatMulNBits"]
        assert len(nbits) == sum(node.op_type == "MatMul" for node in weight_ops(fp32)) > 0
        for node in nbits:
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (8, 32, 4)
        reference, actual = run(fp32, held_out[name]), run(quantized, held_out[name])
        check_outputs_kept(fp32, quantized, reference, actual)
        assert cosine(reference, actual) >= MIN_COSINE["int8-weight"], (name, cosine(reference, actual))


def test_embeddings_stay_fp32(zoo, feeds):
    calibration, _ = feeds("gpt2")
    fp32 = graphs(zoo.artifact("gpt2"))["decoder"]
    for precision in ("int8-static", "int8-weight"):
        quantized = lower(graphs(zoo.artifact("gpt2"))["decoder"], precision, calibration["decoder"])
        tables = {t.name: t.data_type for t in quantized.graph.initializer}
        gathers = [n for n in fp32.graph.node if n.op_type == "Gather" and n.input[0] in tables]
        assert gathers and all(tables[n.input[0]] == onnx.TensorProto.FLOAT for n in gathers)


def test_large_graphs_go_through_external_data(zoo, feeds, monkeypatch):
    """Above the 2 GB threshold the graph is handed to ORT with external data; pretend every graph is large."""
    calibration, held_out = feeds("t5")
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_THRESHOLD", 0)  # the one threshold, where graphs are saved
    fp32 = graphs(zoo.artifact("t5"))["decoder"]
    quantized = lower(graphs(zoo.artifact("t5"))["decoder"], "int8-static", calibration["decoder"], "minmax")
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in quantized.graph.initializer)
    reference, actual = run(fp32, held_out["decoder"]), run(quantized, held_out["decoder"])
    assert cosine(reference, actual) >= MIN_COSINE["int8-static"]


def test_calibration_leaves_no_files_behind(zoo, feeds, tmp_path, monkeypatch):
    calibration, _ = feeds("bert")
    monkeypatch.chdir(tmp_path)
    lower(graphs(zoo.artifact("bert"))["encoder"], "int8-static", calibration["encoder"], "entropy")
    assert list(tmp_path.iterdir()) == []


def _batched(rows: list[dict]) -> dict:
    """Single-row feeds as one batch, each padded on the right with zeros (a masked pad) to the longest."""
    width = max(row["input_ids"].shape[1] for row in rows)
    return {name: np.concatenate([np.pad(row[name], ((0, 0), (0, width - row[name].shape[1]))) for row in rows])
            for name in rows[0]}


def _activation_ranges(model: onnx.ModelProto) -> dict[str, tuple]:
    """Each quantized activation's scale and zero point: what its calibrated range became."""
    values = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    return {node.input[0]: (values[node.input[1]], values[node.input[2]])
            for node in model.graph.node if node.op_type == "QuantizeLinear"}


@pytest.mark.parametrize("method", CALIBRATION_METHODS)
def test_a_batched_feed_is_calibrated_row_by_row(zoo, feeds, monkeypatch, method):
    """The calibrator runs one row of a batch at a time, so its memory is one row's whatever the batch; min-max
    ranges over the rows are the batch's: one feed of three padded rows calibrates as it did whole. (The
    histogram methods grow their histograms feed by feed, so theirs move a little.)"""
    calibration, _ = feeds("bert")
    batch = _batched(calibration["encoder"][:3])
    seen = []

    class Reader(quantize._FeedReader):
        def get_next(self):
            feed = super().get_next()
            seen.extend([] if feed is None else [feed["input_ids"].shape])
            return feed

    monkeypatch.setattr(quantize, "_FeedReader", Reader)
    by_rows = lower(graphs(zoo.artifact("bert"))["encoder"], "int8-static", [batch], method)
    assert seen == [(1, batch["input_ids"].shape[1])] * 3
    if method == "minmax":
        monkeypatch.setattr(quantize, "calibration_rows", lambda path, feeds: list(feeds))  # the batch whole
        whole = lower(graphs(zoo.artifact("bert"))["encoder"], "int8-static", [batch], method)
        assert seen[3:] == [batch["input_ids"].shape]
        assert _activation_ranges(by_rows) and _activation_ranges(by_rows) == _activation_ranges(whole)


def test_a_decoding_step_splits_along_its_batch_axis(zoo, feeds):
    """Every input the graph names a batch axis for is split along it; the rest (the step's total length) go
    with each row as they are."""
    calibration, _ = feeds("gpt2")
    step = next(feed for feed in calibration["decoder"] if feed["past_key_values.0.key"].shape[2] > 0)
    doubled = {name: value if value.ndim == 0 else np.concatenate([value, value]) for name, value in step.items()}
    rows = quantize.calibration_rows(zoo.artifact("gpt2") / "decoder.onnx", [doubled])
    assert len(rows) == 2
    for row in rows:
        assert row.keys() == step.keys() and all(np.array_equal(row[name], step[name]) for name in step)


@pytest.mark.parametrize("missing", [None, []])
def test_static_without_feeds_is_one_clear_error(zoo, missing):
    model = graphs(zoo.artifact("bert"))["encoder"]
    with pytest.raises(HotrodError, match="int8-static .*needs feeds"):
        lower(model, "int8-static", missing)


def test_feeds_of_another_graph_are_refused(zoo, feeds):
    calibration, _ = feeds("t5")
    with pytest.raises(HotrodError, match="lack graph input"):
        lower(graphs(zoo.artifact("t5"))["decoder"], "int8-static", calibration["encoder"])


def test_unknown_method_lists_the_choices(zoo, feeds):
    calibration, _ = feeds("bert")
    with pytest.raises(HotrodError, match="calibration method 'kl'; choose from minmax, percentile, entropy"):
        lower(graphs(zoo.artifact("bert"))["encoder"], "int8-static", calibration["encoder"], method="kl")


def test_tables_agree_with_options():
    assert set(MAX_CALIBRATION_FEEDS) == set(CALIBRATION_METHODS)


@pytest.mark.parametrize("precision", ["int8", "int8-static", "int8-weight", "int4", "int4-b128",
                                       "int4-b256"])
def test_describe_names_the_precision_and_keeps_embeddings_fp32(precision):
    weights = precisions.get(precision).describe("percentile")
    attention = {"attention"} if precisions.get(precision).attention != "fp32" else set()
    assert set(weights) == {"matmul_weights", "lm_head", "embeddings", "activations", *attention}
    assert precision in weights["lm_head"] and weights["embeddings"] == "fp32"
    assert ("percentile" in weights["activations"]) == (precision == "int8-static")


def _matmul_add_graph(bias_is_constant: bool) -> onnx.ModelProto:
    """x [2, 64] @ w [64, 32] + b, b a constant [32] vector or a graph input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])]
    if bias_is_constant:
        weights.append(numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [32]))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
                              weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


@pytest.mark.parametrize("bits, block_size", [(4, 32), (4, 128), (8, 32)])
def test_weight_only_takes_a_constant_bias_into_its_kernel(bits, block_size, monkeypatch):
    from hotrod.optimize import quantize

    feed = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    folded = quantize.weight_only(_matmul_add_graph(True), bits, block_size)
    monkeypatch.setattr(quantize, "fold_bias", lambda model: model)
    unfolded = quantize.weight_only(_matmul_add_graph(True), bits, block_size)
    assert [n.op_type for n in folded.graph.node] == ["MatMulNBits"]
    assert folded.graph.node[0].input[5] == "b" and folded.graph.node[0].output[0] == "y"
    assert [n.op_type for n in unfolded.graph.node] == ["MatMulNBits", "Add"]
    np.testing.assert_allclose(_run(folded, feed), _run(unfolded, feed), rtol=1e-5, atol=1e-5)


def test_a_bias_that_is_not_a_constant_vector_stays_an_add():
    from hotrod.optimize.quantize import weight_only

    model = weight_only(_matmul_add_graph(False), 4)
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits", "Add"]


@pytest.mark.parametrize("opset", [17, 23])
def test_per_row_int8_adds_the_bias_unscaled(opset):
    """onnxruntime's MatMulIntegerToFloat multiplies a bias it fused by a non-scalar activation scale; per-row
    int8 keeps its bias out of the fusion, so rows of any size come out as their float product plus the bias."""
    from hotrod.optimize.quantize import int8_dynamic

    model = _matmul_add_graph(True)
    model.opset_import[0].version = opset
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 64)).astype(np.float32) * np.array([[0.01], [30.0]], dtype=np.float32)
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    b = onnx.numpy_helper.to_array(model.graph.initializer[1])
    quantized = int8_dynamic(model, per_row=True)
    got, want = _run(quantized, {"x": x}), x @ w + b
    for row in range(2):  # int8 error on the product only, relative to each row's own size
        error = np.abs(got[row] - want[row]).max() / np.abs(x[row] @ w).max()
        assert error < 0.05, (row, error)


def test_per_row_int8_quantizes_each_input_in_one_op_at_opset_21():
    """An opset-17 graph is raised to 21 for per-row int8, whose QuantizeLinear takes a whole row as its block:
    the quantization is one op, not a divide, round, shift and cast."""
    from hotrod.optimize.quantize import int8_dynamic

    quantized = int8_dynamic(_matmul_add_graph(True), per_row=True)
    ops = [n.op_type for n in quantized.graph.node]
    assert quantized.opset_import[0].version == 21
    assert ops.count("QuantizeLinear") == 2 and "Round" not in ops and "DynamicQuantizeLinear" not in ops


@pytest.mark.parametrize("opset", [17, 23])
def test_per_row_int8_gives_an_all_zero_row_exactly_its_bias(opset):
    """A row of zeros has the scale 0 (no guard op): its product is exactly zero whatever its 0/0 quantized
    to, and the other rows are untouched."""
    from hotrod.optimize.quantize import int8_dynamic

    model = _matmul_add_graph(True)
    model.opset_import[0].version = opset
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    x[0] = 0.0
    got = _run(int8_dynamic(model, per_row=True), {"x": x})
    w, b = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer[:2])
    assert np.array_equal(got[0], b) and np.isfinite(got).all()
    assert np.abs(got[1] - (x[1] @ w + b)).max() < 0.05 * np.abs(x[1] @ w).max()


def test_per_row_int8_hands_a_bias_to_the_fast_gelu_after_it():
    """A biased product feeding a FastGelu gives the GELU its bias (one pass), with the same outputs."""
    from onnx import helper

    from hotrod.optimize.quantize import int8_dynamic

    model = _matmul_add_graph(True)
    model.graph.node[-1].output[0] = "biased"
    model.graph.node.append(helper.make_node("FastGelu", ["biased"], ["y"], domain="com.microsoft"))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    quantized = int8_dynamic(model, per_row=True)
    gelu = next(n for n in quantized.graph.node if n.op_type == "FastGelu")
    assert list(gelu.input)[1] == "b" and not any(n.op_type in ("Add", "Sub") for n in quantized.graph.node)
    w, b = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer[:2])
    product = x @ w + b
    want = 0.5 * product * (1 + np.tanh(0.7978845608 * (product + 0.044715 * product**3)))
    assert np.abs(_run(quantized, {"x": x}) - want).max() < 0.05 * np.abs(want).max()


def _worst_case_matmul(rows: int = 4, depth: int = 64, width: int = 16) -> tuple[onnx.ModelProto, np.ndarray]:
    """x @ W with positive activations and weights, each column's largest weight beside its others: the
    u8 x s8 pair sums an integer kernel forms are as large as they get. Returns the graph and a feed."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.uniform(0.5, 1.0, (depth, width)).astype(np.float32)
    weight[:2] = 1.0
    x = rng.uniform(0.9, 1.0, (rows, depth)).astype(np.float32)
    x[:, :2] = 1.0  # the activations' maximum: uint8 255 against zero point 0
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", depth])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", width])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), x


@pytest.mark.parametrize("precision", ["int8", "int8-static"])
def test_int8_weights_keep_to_seven_bits_so_every_x86_kernel_is_exact(precision):
    """Without VNNI (AVX2 alone) onnxruntime's u8 x s8 kernel adds pairs of products in int16, saturating
    past 32767: full-range weights (255 * 127 * 2) gave a tiny GPT-2 logits at cosine 0.993 to fp32 there.
    Weights in [-64, 64] fit (255 * 64 * 2 = 32640); the product on this CPU must be the exact one."""
    model, x = _worst_case_matmul()
    exact = x @ onnx.numpy_helper.to_array(model.graph.initializer[0])
    quantized = lower(model, precision, [{"x": x}])
    weights = [onnx.numpy_helper.to_array(t) for t in quantized.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert weights and all(np.abs(w.astype(np.int32)).max() <= 64 for w in weights)
    [[got]] = run(quantized, [{"x": x}])  # as sessions run it, after onnxruntime's own fusions
    assert np.abs(got - exact).max() <= 0.02 * np.abs(exact).max()  # a saturated sum is off by about half


def test_a_constant_shared_with_a_quantized_gemm_stays_fp32_for_its_other_readers():
    """A Gemm's bias becomes int32 behind a DequantizeLinear; a layer norm reading the same initializer (an
    optimizer merges equal constants: zero biases and betas) keeps reading it in fp32, to the bit."""
    rng = np.random.default_rng(0)
    shared = rng.standard_normal(8).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(shared, "c"), onnx.numpy_helper.from_array(np.ones(8, np.float32), "g")]
    nodes = [onnx.helper.make_node("Gemm", ["x", "w", "c"], ["y"]),
             onnx.helper.make_node("LayerNormalization", ["y", "g", "c"], ["z"], epsilon=1e-5)]
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
                                   [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [4, 8])], inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    feeds = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]
    quantized = quantize.int8_static(model, feeds)
    gemm = next(node for node in quantized.graph.node if node.op_type == "Gemm")
    norm = next(node for node in quantized.graph.node if node.op_type == "LayerNormalization")
    constants = {init.name: init for init in quantized.graph.initializer}
    assert norm.input[2] in constants, "the layer norm reads its beta through a node"
    assert np.array_equal(onnx.numpy_helper.to_array(constants[norm.input[2]]), shared)
    assert gemm.input[2] not in constants  # the Gemm's own copy was quantized
