"""fp16 / bf16 mixed precision: the overflow search, the converted graphs and what onnxruntime can run
(`optimize/mixed.py`, `optimize/convert.py`, `optimize/emulate.py`, `runtime/kernels.py`).

The T5 here has its feed-forward weights scaled up so that, as in real T5 checkpoints, the wo projection
and the residual stream after it grow past fp16's 65504: a plain fp16 conversion returns Inf/NaN, and
the search must find the nodes to keep in fp32.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import hotrod
from hotrod import precisions
from hotrod.optimize.calibration import capture_feeds
from hotrod.optimize.convert import convert
from hotrod.optimize.emulate import emulate
from hotrod.optimize.mixed import KEEP_FP32_OPS, to_half
from hotrod.runtime.kernels import half_supported
from tests.zoo import CASES, build_checkpoint

GRAPHS = {"t5": ("encoder", "decoder_init", "decoder"), "gpt2": ("decoder",), "bert": ("encoder",)}
TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world this is a tiny model", "pack my box"]
FEED_FORWARD_SCALE = 300.0  # on wi and wo: wo's output reaches ~1e5, past fp16's range


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, feeds: list[dict]) -> list[list[np.ndarray]]:
    session = _session(model)
    return [session.run(None, feed) for feed in feeds]


def _errors(reference: list[list[np.ndarray]], actual: list[list[np.ndarray]]) -> list[tuple[bool, float, float]]:
    """Per output, over all feeds: whether it is finite, its largest difference, its largest fp32 magnitude."""
    found = []
    for index in range(len(reference[0])):
        refs, outs = [r[index] for r in reference], [a[index] for a in actual]
        found.append((all(np.isfinite(o).all() for o in outs),
                      max(float(np.abs(r - o).max()) for r, o in zip(refs, outs)),
                      max(float(np.abs(r).max()) for r in refs)))
    return found


def _within(reference, actual, report: dict) -> bool:
    return all(finite and diff <= report["atol"] + report["rtol"] * magnitude
               for finite, diff, magnitude in _errors(reference, actual))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """name -> (fp32 graphs, feeds per graph) of the exported artifact, memoised."""
    made = {}

    def build(name: str):
        if name not in made:
            root = tmp_path_factory.mktemp(name)
            checkpoint = _hot_t5(root / "checkpoint") if name == "t5" else build_checkpoint(CASES[name], root / "checkpoint")
            # The fp32 export's own verification against transformers is other tests' business.
            artifact = hotrod.optimize(checkpoint, root / "artifact", progress=False, verify_examples=0)
            feeds = capture_feeds(hotrod.load(artifact), TEXTS, max_new_tokens=4, per_graph=8)
            graphs = {graph: onnx.load(str(artifact / f"{graph}.onnx")) for graph in GRAPHS[name]}
            made[name] = graphs, feeds
        return made[name]

    return build


def _hot_t5(directory):
    """The tiny T5 of the table, seeded, with wi and wo scaled up."""
    torch.manual_seed(0)
    model = CASES["t5"].hf_class(CASES["t5"].config()).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "DenseReluDense.w" in name:
                weight.mul_(FEED_FORWARD_SCALE)
    model.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("graph", GRAPHS["t5"])
def test_plain_fp16_of_the_hot_t5_overflows(recorded, graph):
    models, feeds = recorded("t5")
    naive, _ = emulate(convert(models[graph], precisions.half("fp16"), KEEP_FP32_OPS, []), precisions.half("fp16"))
    errors = _errors(_run(models[graph], feeds[graph]), _run(naive, feeds[graph]))
    assert any(not finite or diff > 0.1 * magnitude for finite, diff, magnitude in errors)


@pytest.mark.parametrize("graph", GRAPHS["t5"])
def test_search_keeps_the_overflowing_nodes_of_t5_in_fp32(recorded, graph):
    models, feeds = recorded("t5")
    half, report = to_half(models[graph], precisions.half("fp16"), feeds[graph])
    assert report["dtype"] == "fp16" and report["kept_node_count"] == len(report["kept_nodes"]) > 0
    assert any("DenseReluDense/wo" in node for node in report["kept_nodes"]), report["kept_nodes"]
    assert "Relu" in report["kept_op_types"]  # softmax now runs inside the fused attention op
    assert report["cosine"] > 0.999 and np.isfinite(report["max_abs_diff"])
    reference = _run(models[graph], feeds[graph])
    assert _within(reference, _run(emulate(half, precisions.half("fp16"))[0], feeds[graph]), report)
    # The graph itself loads in onnxruntime with the fp32 interface of the original, and runs finite.
    assert _io_types(half) == _io_types(models[graph])
    assert any(t.data_type == TensorProto.FLOAT16 for t in half.graph.initializer)
    assert _within(reference, _run(half, feeds[graph]), report)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_index_arithmetic_stays_fp32(recorded, dtype):
    """T5's relative-position buckets truncate float arithmetic to an index: half rounding would move
    distances to the next bucket, so everything feeding such a Cast stays fp32."""
    models, feeds = recorded("t5")
    half, report = to_half(models["encoder"], precisions.half(dtype), feeds["encoder"])
    assert report["index_math_nodes"] > 0
    types = {v.name: v.type.tensor_type.elem_type for v in half.graph.value_info}
    read = [types.get(n.input[0]) for n in half.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.INT64]
    assert TensorProto.FLOAT in read and not {TensorProto.FLOAT16, TensorProto.BFLOAT16} & set(read)


def test_bf16_has_the_range_fp16_lacks(recorded):
    models, feeds = recorded("t5")
    half, report = to_half(models["encoder"], precisions.half("bf16"), feeds["encoder"])
    assert report["kept_node_count"] == 0 and report["rounds"] == 1
    assert any(t.data_type == TensorProto.BFLOAT16 for t in half.graph.initializer)
    assert _io_types(half) == _io_types(models["encoder"])
    assert _within(_run(models["encoder"], feeds["encoder"]),
                   _run(emulate(half, precisions.half("bf16"))[0], feeds["encoder"]), report)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_ordinary_models_convert_with_few_kept_nodes(recorded, name, dtype):
    models, feeds = recorded(name)
    (graph,) = GRAPHS[name]
    half, report = to_half(models[graph], precisions.half(dtype), feeds[graph])
    assert report["kept_node_count"] <= 2 and report["rounds"] <= 2
    assert report["cosine"] > 0.999
    assert _within(_run(models[graph], feeds[graph]), _run(emulate(half, precisions.half(dtype))[0], feeds[graph]), report)


def test_a_search_that_cannot_finish_names_what_fails(recorded):
    models, feeds = recorded("t5")
    with pytest.raises(hotrod.HotrodError, match="fp16 encoder: values still overflow: .*after 1 round"):
        to_half(models["encoder"], precisions.half("fp16"), feeds["encoder"], max_rounds=1, name="encoder")


def _io_types(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(v.name, v.type.tensor_type.elem_type) for v in [*model.graph.input, *model.graph.output]]


def _chain(dtype: int) -> onnx.ModelProto:
    """x @ w + b in `dtype`, with x @ w = 80000 (past fp16's range) and the sum back at 20000."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, dtype, s) for n, s in [("x", [1, 2]), ("w", [2, 1]), ("b", [1, 1])]]
    graph = helper.make_graph(nodes, "chain", inputs, [helper.make_tensor_value_info("y", dtype, None)],
                              value_info=[helper.make_tensor_value_info("m", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


CHAIN_FEED = {"x": np.array([[200, 200]]), "w": np.array([[200], [200]]), "b": np.array([[-60000]])}


def test_emulation_overflows_where_half_arithmetic_does():
    emulated, held = emulate(_chain(TensorProto.FLOAT16), precisions.half("fp16"))
    assert {"m", "y"} <= held
    (y,) = _session(emulated).run(None, {k: v.astype(np.float32) for k, v in CHAIN_FEED.items()})
    f16 = {k: v.astype(np.float16) for k, v in CHAIN_FEED.items()}
    with np.errstate(over="ignore"):
        expected = (f16["x"].astype(np.float32) @ f16["w"].astype(np.float32)).astype(np.float16) + f16["b"]
    assert np.isinf(expected).all() and np.isinf(y).all()


def test_half_supported_tells_the_truth_about_this_onnxruntime():
    # fp16 on the CPU: a real half MatMul stores 80000 as Inf; onnxruntime's fp32 fallback returns 20000.
    session = _session(_chain(TensorProto.FLOAT16))
    (y,) = session.run(None, {k: v.astype(np.float16) for k, v in CHAIN_FEED.items()})
    assert half_supported(precisions.half("fp16"), "cpu", ["MatMul", "Add"]) == bool(np.isinf(y).all())
    # bf16 on the CPU: supported exactly when such a graph loads at all.
    try:
        _session(_chain(TensorProto.BFLOAT16))
        loads = True
    except Exception:  # noqa: BLE001
        loads = False
    assert half_supported(precisions.half("bf16"), "cpu", ["MatMul", "Add"]) == loads
    for half in (precisions.half("fp16"), precisions.half("bf16")):  # the whole op set only where each part
        assert half_supported(half, "cpu") <= half_supported(half, "cpu", ["MatMul", "Add"])
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert not any(half_supported(precisions.half(name), "cuda") for name in ("fp16", "bf16"))


@pytest.mark.parametrize("call", [
    lambda m, f: precisions.half("fp8"),  # the passes take a spec; its name is checked where it is looked up
    lambda m, f: precisions.half("float16"),
    lambda m, f: precisions.half("int8"),
    lambda m, f: to_half(m, precisions.half("fp16"), []),
    lambda m, f: to_half(m, precisions.half("fp16"), [{}]),
    lambda m, f: half_supported(precisions.half("fp16"), "tpu"),
])
def test_bad_input_is_a_hotrod_error(recorded, call):
    models, feeds = recorded("bert")
    with pytest.raises(hotrod.HotrodError):
        call(models["encoder"], feeds["encoder"])


@pytest.mark.parametrize("case_name, ops", [("t5", {"Relu", "Log"}), ("gpt2", set()), ("bert", set())])
def test_each_graph_carries_its_familys_fp32_ops(zoo, case_name, ops):
    """T5's own fragile ops travel in its graphs' metadata; other families keep only the generic list."""
    from hotrod.optimize.mixed import graph_fp32_ops

    artifact = zoo.artifact(case_name)
    graphs = sorted(artifact.glob("*.onnx"))
    assert graphs and all(graph_fp32_ops(onnx.load(str(g), load_external_data=False)) == ops for g in graphs)
    assert not ops & set(KEEP_FP32_OPS)
