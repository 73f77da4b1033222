"""Dynamic int8 with one activation scale per row, so that a row's answer never depends on its batch-mates.

ONNX Runtime's dynamic quantizer puts a DynamicQuantizeLinear before each integer MatMul: one scale and
zero point for the whole input tensor, taken from its minimum and maximum. In a batch, a row's int8
values then depend on the largest value in any other row, and so do its logits (and at times its greedy
tokens): a served request's answer would change with the load. Here each DynamicQuantizeLinear becomes
symmetric quantization per row (per token, along the last axis):

    scale[r] = max(|x[r, :]|) / 127,    q[r, k] = round(x[r, k] / scale[r]) + 128  (uint8)

with the zero point fixed at 128, so the MatMulInteger downstream is unchanged: a scalar zero point, and
the row scales broadcast where the quantizer multiplied its one scale by the weights' (ONNX Runtime still
fuses the pair into MatMulIntegerToFloat). uint8 rather than int8 activations: onnxruntime's x86 integer
kernels multiply u8 by s8, and s8 x s8 ran several times slower here. |q - 128| <= 127 with weights in 7 bits
keeps the u8 x s8 pair sums within int16 on CPUs without VNNI (`hotrod.optimize.quantize`).

onnxruntime fuses MatMulInteger, its Cast, the scale's Mul and a following bias Add into one
MatMulIntegerToFloat; with an activation scale that is not a scalar its CPU kernel adds the bias before it
multiplies by that scale, so the bias comes out scaled by each row's scale (measured: the demo's MiniLM
tagger fell from entity F1 0.94 to 0.31 against fp32 that way). The bias is therefore subtracted, negated
(`Sub` is not fused), after the fused product: the same sum, one elementwise pass more.

The maximum of |x| is ReduceMax(Abs(x)): at a decoding step, where a row is a few KB, the op count is what
costs, and this is two ops where max(ReduceMax(x), -ReduceMin(x)) is four. An all-zero row gets the
scale 0 and no guard: whatever integers its 0/0 quantizes to, the product is multiplied by that scale, so
the row's output is exactly zero (plus the bias), as in float.

From opset 21 the quantization is one QuantizeLinear whose block is the whole row, so the graph is raised
to opset 21 where that changes no other op's meaning (`hotrod.optimize.fusion.raise_opset`; hotrod exports
at 17); a graph that cannot be raised spells it out (divide, round, shift, cast). Where the product feeds a
FastGelu (GPT-2's MLP), the bias goes into the FastGelu's bias input instead of a Sub. With these, the
per-row build costs little more than the per-call build, the gap growing with a batch's rows
(`benchmarks/int8_rows.py` measures the two side by side). What is left is passes over memory at many rows:
the range and quantize passes over each input, onnxruntime's separate pass scaling a product by per-row
scales, and the bias's pass where no GELU takes it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.optimize import graphs
from hotrod.optimize.fusion import raise_opset

LEVELS = 127.0  # symmetric int8 steps either side of zero
ZERO_POINT = 128
_HUGE = 1e30  # a quantization step no scale reaches: scale / _HUGE rounds to 0
_BLOCKED_QUANTIZE_OPSET = 21  # QuantizeLinear's block_size
_REDUCE_AXES_INPUT_OPSET = 18  # ReduceMax / ReduceMin take their axes as an input


SHARED = "hotrod_per_row"  # the names of the graph-wide constants below start with this


def per_row_activations(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (from ORT's `quantize_dynamic`) with every DynamicQuantizeLinear quantizing per row."""
    graph = model.graph
    if any(node.op_type == "DynamicQuantizeLinear" for node in graph.node):
        raise_opset(model, _BLOCKED_QUANTIZE_OPSET)  # where it means no change elsewhere: one op quantizes
    opset = _opset(model)
    lengths = _row_lengths(graph)
    nodes: list[onnx.NodeProto] = []
    zero_points: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        nodes.extend(_row_quantization(node, lengths.get(node.input[0]), opset, f"{SHARED}{len(zero_points)}"))
        zero_points[node.output[2]] = f"{SHARED}_zero_point"
    if not zero_points:
        return model
    for node in nodes:  # every quantized input has the one zero point
        node.input[:] = [zero_points.get(name, name) for name in node.input]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(_shared_constants())
    _biases_after_scaling(graph)
    return model


def _biases_after_scaling(graph: onnx.GraphProto) -> None:
    """Each `MatMulInteger -> Cast -> Mul (scales) -> Add (constant bias)` becomes `... -> Sub (negated bias)`,
    so onnxruntime fuses the scaled product without the bias (see the module docstring), or, before a GELU,
    hands the bias to a FastGelu."""
    consumers = graphs.readers(graph)
    weights = {tensor.name: tensor for tensor in graph.initializer}
    negated: dict[str, str] = {}
    dropped: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type != "MatMulInteger":
            continue
        add = _single_path(consumers, node.output[0], ("Cast", "Mul", "Add"))
        if add is None:
            continue
        constant = [name for name in add.input if name in weights]
        if len(constant) != 1:
            continue
        bias = constant[0]
        product = next(name for name in add.input if name != bias)
        if _bias_into_gelu(consumers.get(add.output[0], []), product, bias):
            dropped.append(add)
            continue
        if bias not in negated:
            negated[bias] = f"{bias}_{SHARED}_negated"
            graph.initializer.append(numpy_helper.from_array(-numpy_helper.to_array(weights[bias]), negated[bias]))
        add.op_type = "Sub"
        add.input[:] = [product, negated[bias]]
    for add in dropped:
        graph.node.remove(add)


def _bias_into_gelu(following: list[onnx.NodeProto], product: str, bias: str) -> bool:
    """Where the biased product's one consumer is a FastGelu (GPT-2's), the bias goes to its bias input, added
    in the pass that applies the GELU: no Add or Sub of its own. Not BiasGelu for an exact Gelu: its CPU
    kernel is slower than Add + Gelu (`hotrod.optimize.fusion`). Returns whether that was done."""
    if len(following) != 1:
        return False
    gelu = following[0]
    if gelu.op_type == "FastGelu" and gelu.domain == "com.microsoft" and len(gelu.input) == 1:
        gelu.input[:] = [product, bias]
        return True
    return False


def _single_path(consumers: dict[str, list[onnx.NodeProto]], name: str, ops: tuple[str, ...]) -> onnx.NodeProto | None:
    """The last node of a chain of single consumers of `name` whose types are `ops`, or None."""
    node = None
    for op in ops:
        following = consumers.get(name, [])
        if len(following) != 1 or following[0].op_type != op:
            return None
        node = following[0]
        name = node.output[0]
    return node


def _shared_constants() -> list[onnx.TensorProto]:
    values = {"levels": (LEVELS, np.float32), "shift": (float(ZERO_POINT), np.float32),
              "huge": (_HUGE, np.float32), "zero_point": (ZERO_POINT, np.uint8), "axes": ([-1], np.int64)}
    return [numpy_helper.from_array(np.array(v, dtype=t), f"{SHARED}_{k}") for k, (v, t) in values.items()]


def _row_quantization(node: onnx.NodeProto, length: int | None, opset: int, p: str) -> list[onnx.NodeProto]:
    """Nodes computing `node`'s quantized input and its scale, per row (the zero point is shared); the
    names of what they add start with `p`."""
    x = node.input[0]
    quantized, scale = node.output[:2]
    c = SHARED
    nodes = [helper.make_node("Abs", [x], [f"{p}_abs"]), _reduce("ReduceMax", f"{p}_abs", f"{p}_max", opset),
             helper.make_node("Div", [f"{p}_max", f"{c}_levels"], [scale])]
    if length and opset >= _BLOCKED_QUANTIZE_OPSET:
        return nodes + [  # one QuantizeLinear whose block is the whole row; its zero point has the scale's shape:
            # the scale quantized with a step so large that every value lands on the zero point, in one op
            helper.make_node("QuantizeLinear", [scale, f"{c}_huge", f"{c}_zero_point"], [f"{p}_zero_points"]),
            helper.make_node("QuantizeLinear", [x, scale, f"{p}_zero_points"], [quantized], axis=-1,
                             block_size=length),
        ]
    return nodes + [
        helper.make_node("Div", [x, scale], [f"{p}_steps"]),
        helper.make_node("Round", [f"{p}_steps"], [f"{p}_rounded"]),
        helper.make_node("Add", [f"{p}_rounded", f"{c}_shift"], [f"{p}_shifted"]),
        helper.make_node("Cast", [f"{p}_shifted"], [quantized], to=TensorProto.UINT8),
    ]


def _reduce(op: str, x: str, out: str, opset: int) -> onnx.NodeProto:
    if opset >= _REDUCE_AXES_INPUT_OPSET:
        return helper.make_node(op, [x, f"{SHARED}_axes"], [out], keepdims=1)
    return helper.make_node(op, [x], [out], axes=[-1], keepdims=1)


def _row_lengths(graph: onnx.GraphProto) -> dict[str, int]:
    """The row length (K) of each dynamically quantized input: the first axis of the weight it multiplies."""
    weights = {t.name: list(t.dims) for t in graph.initializer}
    sources = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "DynamicQuantizeLinear"}
    lengths: dict[str, int] = {}
    for node in graph.node:
        if node.op_type == "MatMulInteger" and node.input[0] in sources and len(weights.get(node.input[1], ())) == 2:
            lengths[sources[node.input[0]]] = weights[node.input[1]][0]
    return lengths


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
