"""Which half kernels this onnxruntime has on a device, asked of onnxruntime itself with a probe graph.

Asked rather than read from a table, so the answer stays true as kernels are added. `hotrod optimize`
refuses fp16 / bf16 for a device without them, and `--precision auto` tries them only where they exist.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.errors import HotrodError, check_choice

if TYPE_CHECKING:  # the spec is passed in (`hotrod.precisions.Half.has_kernels` asks here)
    from hotrod.precisions import Half

# The compute ops of hotrod's fused graphs; the data movement ops (Gather, Reshape, ...) run in any type.
GRAPH_OPS = ("MatMul", "Add", "Mul", "Where", "FastGelu", "LayerNormalization", "SkipLayerNormalization",
             "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_PROBE_CASTS = ("probe_input", "probe_output")
_WIDTH = 8


def half_supported(half: Half, device: str, ops: Sequence[str] = GRAPH_OPS) -> bool:
    """Whether onnxruntime on `device` ("cpu" or "cuda") runs `ops` in `half` (fp16 or bf16:
    `hotrod.precisions.half`) with its own half kernels.

    A session that loads but has onnxruntime wrap nodes in Casts to fp32 (its CPU provider with fp16)
    does not count: the graph then computes in fp32, slower than the fp32 graph.
    """
    check_choice("device", device, tuple(_PROVIDERS))
    return _probe(half, device, tuple(sorted(set(ops))))


@cache
def _probe(half: Half, device: str, ops: tuple[str, ...]) -> bool:
    import onnxruntime as ort

    provider = _PROVIDERS[device]
    if provider not in ort.get_available_providers():
        return False
    model, feed = _probe_graph(half, ops)
    with tempfile.TemporaryDirectory(prefix="hotrod-probe-") as scratch:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4
        options.optimized_model_filepath = str(Path(scratch) / "placed.onnx")
        if device != "cpu":  # a node the device cannot run must fail the probe, not move to the CPU
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            session = ort.InferenceSession(model.SerializeToString(), options, providers=[provider])
            (result,) = session.run(None, feed)
        except Exception:  # noqa: BLE001  (no kernel: onnxruntime raises its own exception types)
            return False
        placed = onnx.load(options.optimized_model_filepath)
    inserted = [n for n in placed.graph.node if n.op_type == "Cast" and n.name not in _PROBE_CASTS]
    return not inserted and bool(np.isfinite(result).all())


def _probe_graph(half: Half, ops: Sequence[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A chain [1, 2, 8] -> [1, 2, 8] that passes through one node of each op in `ops`, all in `half`.

    Its input and output are fp32, cast inside the graph (onnxruntime's Python API takes no bfloat16
    arrays); those two Casts are named in _PROBE_CASTS, so that any other Cast is one onnxruntime added.
    """
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Cast", ["x"], ["h0"], to=half.onnx_type, name=_PROBE_CASTS[0])]
    weights = []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        values = rng.standard_normal(shape).astype(np.float32) * 0.1
        weights.append(numpy_helper.from_array(values.astype(half.numpy_type), name))
        return name

    current = "h0"
    for index, op in enumerate(ops):
        out = f"h{index + 1}"
        nodes.append(_probe_node(op, current, out, weight, _WIDTH, index))
        current = out
    nodes.append(helper.make_node("Cast", [current], ["y"], to=TensorProto.FLOAT, name=_PROBE_CASTS[1]))
    condition = numpy_helper.from_array(np.array([True, False] * (_WIDTH // 2)), "condition")
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, _WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [*weights, condition])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9)
    return model, {"x": rng.standard_normal((1, 2, _WIDTH)).astype(np.float32)}


def _probe_node(op: str, current: str, out: str, weight, width: int, index: int) -> onnx.NodeProto:
    """One node of `op` reading `current` ([1, 2, width]) and writing `out` of the same shape."""
    name = f"probe_{index}"
    ms = "com.microsoft"
    if op == "MatMul":
        return helper.make_node(op, [current, weight(f"w{index}", (width, width))], [out], name=name)
    if op in ("Add", "Mul", "Sub", "Div"):
        return helper.make_node(op, [current, weight(f"b{index}", (width,))], [out], name=name)
    if op == "Where":
        return helper.make_node(op, ["condition", current, weight(f"b{index}", (width,))], [out], name=name)
    if op == "LayerNormalization":
        return helper.make_node(op, [current, weight(f"g{index}", (width,)), weight(f"b{index}", (width,))], [out],
                                axis=-1, name=name)
    if op == "SimplifiedLayerNormalization":
        return helper.make_node(op, [current, weight(f"g{index}", (width,))], [out], axis=-1, name=name)
    if op == "SkipLayerNormalization":
        return helper.make_node(op, [current, current, weight(f"g{index}", (width,)), weight(f"b{index}", (width,))],
                                [out], domain=ms, name=name)
    if op == "SkipSimplifiedLayerNormalization":
        return helper.make_node(op, [current, current, weight(f"g{index}", (width,))], [out], domain=ms, name=name)
    if op in ("FastGelu", "Gelu"):
        return helper.make_node(op, [current], [out], domain=ms, name=name)
    if op == "BiasGelu":
        return helper.make_node(op, [current, weight(f"b{index}", (width,))], [out], domain=ms, name=name)
    if op in ("Softmax", "Relu", "Tanh", "Sigmoid", "Erf", "Neg", "Identity"):
        return helper.make_node(op, [current], [out], name=name)
    raise HotrodError(f"half_supported cannot probe op {op!r}")
