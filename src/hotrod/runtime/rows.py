"""Per-row int8 quantization on hotrod's kernel: each product input's five quantizing nodes as one op.

hotrod's dynamic int8 graphs quantize each product's input per row (`hotrod.optimize.row_scales`) with
onnxruntime's own ops, so an artifact runs anywhere:

    Abs(x) -> ReduceMax -> Div(127) = scale;  QuantizeLinear(scale, huge, zp) = zero points;
    QuantizeLinear(x, scale, zero points, block = the row) = q

five nodes, each a pass over memory and a dispatch, for every product's input (four a layer): at batch 1 the
dispatches, at many rows the passes. As a graph is loaded where the kernels' library runs
(`hotrod.runtime.native`), each such chain becomes one QuantizeRows (`hotrod/native/rows.c`), which reads a
row once for its maximum and once more, from the cache, to quantize it, with the same divisions and
rounding: the same q and scales, so the same answers (onnxruntime infers no shapes through a custom op,
so no session-level fusion may depend on them: `hotrod.runtime.ort_sessions.CPU_DISABLED_OPTIMIZERS`). A
chain whose intermediate values anything else reads is left as it is.
"""

from __future__ import annotations

import onnx
from onnx import helper

from hotrod.optimize import graphs
from hotrod.optimize.row_scales import SHARED
from hotrod.runtime import native

OP = "QuantizeRows"
_LEVELS, _HUGE = f"{SHARED}_levels", f"{SHARED}_huge"


def rewrite(model: onnx.ModelProto) -> int:
    """Every per-row quantizing chain of `model` as QuantizeRows, in place; returns how many."""
    graph = model.graph
    producers = graphs.producers(graph)
    readers = {name: len(nodes) for name, nodes in graphs.readers(graph).items()}
    for value in graph.output:  # the graph's outputs read a value too
        readers[value.name] = readers.get(value.name, 0) + 1
    chains = [chain for node in graph.node if (chain := _chain(node, producers, readers)) is not None]
    if not chains:
        return 0
    dropped = {id(node) for chain in chains for node in chain[1:]}
    replacements = {id(chain[0]): _op(chain) for chain in chains}
    nodes = [replacements.get(id(node), node) for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unread_constants(graph)
    native.add_domain(model)
    return len(chains)


def _chain(node: onnx.NodeProto, producers: dict, readers: dict) -> list[onnx.NodeProto] | None:
    """[Abs, ReduceMax, Div, QuantizeLinear (zero points), QuantizeLinear (q)] ending at `node`, where it ends
    one as `hotrod.optimize.row_scales` writes it and nothing else reads what lies within; None otherwise."""
    if node.op_type != "QuantizeLinear" or len(node.input) != 3 or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("axis", 1) != -1 or "block_size" not in attrs:
        return None
    x, scale, zero_points = node.input
    div, points = producers.get(scale), producers.get(zero_points)
    if div is None or div.op_type != "Div" or list(div.input[1:]) != [_LEVELS]:
        return None
    reduce = producers.get(div.input[0])
    if reduce is None or reduce.op_type != "ReduceMax" or _reduce_attrs(reduce) != (-1, 1):
        return None
    absolute = producers.get(reduce.input[0])
    if absolute is None or absolute.op_type != "Abs" or absolute.input[0] != x:
        return None
    if points is None or points.op_type != "QuantizeLinear" or list(points.input[:2]) != [scale, _HUGE]:
        return None
    inner = (absolute.output[0], reduce.output[0], zero_points)
    if any(readers.get(name, 0) != 1 for name in inner):
        return None
    return [absolute, reduce, div, points, node]


def _reduce_attrs(node: onnx.NodeProto) -> tuple[int | None, int]:
    """(the one axis reduced, keepdims), with the axes from the attribute or from the shared constant."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axes = attrs.get("axes")
    if axes is None and len(node.input) > 1 and node.input[1] == f"{SHARED}_axes":
        axes = [-1]
    return (axes[0] if axes and len(axes) == 1 else None), attrs.get("keepdims", 1)


def _op(chain: list[onnx.NodeProto]) -> onnx.NodeProto:
    absolute, last = chain[0], chain[-1]
    x, scale = last.input[0], last.input[1]
    return helper.make_node(OP, [x], [last.output[0], scale], name=f"{absolute.name or last.output[0]}_rows",
                            domain=native.DOMAIN)


def _drop_unread_constants(graph: onnx.GraphProto) -> None:
    """The chains' shared constants, where no node reads them any more (removed one by one: a few small
    entries, where rebuilding the list would copy every weight)."""
    read = graphs.read_names(graph)
    for init in [init for init in graph.initializer if init.name.startswith(SHARED) and init.name not in read]:
        graph.initializer.remove(init)
