"""Mixed precision: fp16 / bf16 graphs that never produce NaN or Inf, found by searching on real inputs.

Half precision halves the bytes every step reads and runs on tensor cores, but fp16 tops out at 65504:
a T5 feed-forward or a residual stream can grow past it, and the graph then returns Inf, then NaN.
Which nodes do so depends on the weights, so each graph is searched with inputs recorded from the fp32
model (`hotrod.optimize.calibration.capture_feeds`):

1. convert (`optimize/convert.py`), keeping KEEP_FP32_OPS and the family's own (`Family.fp32_ops`), index
   arithmetic and the nodes found so far in fp32; graph inputs and outputs stay fp32, so the runtime's
   interface does not change;
2. run the fp32 graph and the half graph, emulated as a device with half kernels runs it
   (`optimize/emulate.py`), on every feed with every intermediate value exposed;
3. each value that first goes non-finite in half, or that fp32 shows to be beyond the half range while
   the half graph holds it in half, keeps its node in fp32; a node already kept whose output is still
   too large to be stored in half keeps its consumers instead, so the fp32 island grows until the value
   is back in range (a norm, usually);
4. repeat until every output is finite and within tolerance of fp32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto

from hotrod.errors import HotrodError, check_number
from hotrod.optimize.calibration import graph_feed
from hotrod.optimize.convert import convert, converter_default_blocks
from hotrod.optimize.emulate import Comparison, GraphInfo, Runner, cast_target, compare, copy_model

if TYPE_CHECKING:  # specs are passed in: `hotrod.precisions` lowers through these passes, never the reverse
    from hotrod.precisions import Half

KEEP_FP32_OPS: tuple[str, ...] = (
    "Pow",  # x**2 of a hand-written norm overflows fp16 once |x| > 256
    "ReduceMean",  # the mean of those squares needs fp32's range; the variance sets the whole layer's scale
    "Sqrt",  # the root of a variance: small variances lose their digits in half
    "Softmax",  # where scores meet the mask's large negatives; fp32 keeps the exponentials and their sum exact
    "ReduceSum",  # sums of squares or exponentials overflow half long before their terms do
    "Exp",  # exp overflows fp16 above 11
    # The decoder's KV cache is an fp32 buffer the op updates in place; in half it would read and write a
    # cast copy, and the step's keys and values would never reach the buffer.
    "GroupQueryAttention",
    "ScatterND",  # the same buffers, written in place by the GPU form of that attention (optimize/portable.py)
)
# A graph's own additions to that list (its family's `fp32_ops`), comma-separated in its metadata.
FP32_OPS_KEY = "hotrod.keep_fp32_ops"
MAX_ROUNDS = 8
_INTEGER_TYPES = {
    TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT64,
    TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8, TensorProto.BOOL,
}


def to_half(model: onnx.ModelProto, half: Half, feeds: Sequence[Mapping[str, np.ndarray]],
            rtol: float | None = None, atol: float | None = None, max_rounds: int = MAX_ROUNDS, *,
            name: str | None = None) -> tuple[onnx.ModelProto, dict]:
    """Convert a (fused, fp32) graph to `half` (fp16 or bf16: `hotrod.precisions.half`), keeping KEEP_FP32_OPS
    and every node the search finds in fp32.

    `feeds` are real inputs of this graph; the search keeps nodes until every output is finite and each
    output's largest difference from fp32 is within `atol + rtol * (its largest magnitude)` on all of
    them (defaults per type: `hotrod.precisions`). Returns the half graph (fp32 inputs and outputs) and the
    report for the manifest; raises HotrodError, naming the graph `name`, when `max_rounds` rounds do not
    get there.
    """
    rtol = half.rtol if rtol is None else rtol
    atol = half.atol if atol is None else atol
    if not feeds:
        raise HotrodError("mixed precision needs at least one recorded input of the graph")
    check_number("max_rounds", max_rounds, 1)
    base = _named(model)
    graph = GraphInfo(base)
    feeds = [graph_feed([i.name for i in base.graph.input], feed) for feed in feeds]
    reference = Runner(base, graph.all_values())
    graph.learn_types(reference.run(feeds[0]))
    op_kept = set(KEEP_FP32_OPS) | graph_fp32_ops(model) | converter_default_blocks()
    kept_types = {node.name for node in base.graph.node if node.op_type in op_kept}
    index_nodes = _index_math(base, graph)
    searched: set[str] = set()
    for round_number in range(1, max_rounds + 1):
        converted = convert(base, half, op_kept, index_nodes | searched)
        result = compare(reference, converted, half, graph, feeds)
        if result.within(rtol, atol):
            report = _report(graph, half, op_kept, searched, index_nodes, round_number, result, rtol, atol, len(feeds))
            return converted, report
        fixes = _fixes(result, graph, kept_types | index_nodes | searched)
        if not fixes:
            break
        searched |= fixes
    raise HotrodError(f"{half.name} {name or model.graph.name or 'graph'}: {result.failure(rtol, atol)} "
                      f"after {round_number} round(s) keeping {len(searched)} node(s) in fp32")


def graph_fp32_ops(model: onnx.ModelProto) -> set[str]:
    """The operators `model`'s family keeps in fp32, as its export recorded them (`FP32_OPS_KEY`)."""
    value = next((p.value for p in model.metadata_props if p.key == FP32_OPS_KEY), "")
    return {op for op in value.split(",") if op}


def _fixes(result: Comparison, graph: GraphInfo, kept: set[str]) -> set[str]:
    """The nodes to keep in fp32 next round: the producer of each value where overflow starts, or, when
    that producer already runs in fp32 (its output is still stored in half), the value's consumers."""
    fixes: set[str] = set()
    for value in result.culprits(graph):
        producer = graph.producer.get(value)
        if producer is not None and producer not in kept:
            fixes.add(producer)
        else:
            fixes |= {c for c in graph.consumers.get(value, ()) if c not in kept and graph.has_float_output(c)}
    return fixes


def _report(graph: GraphInfo, half: Half, op_kept: set[str], searched: set[str], index_nodes: set[str],
            rounds: int, result: Comparison, rtol: float, atol: float, feed_count: int) -> dict:
    """What the manifest records: the type, what stayed fp32 and why, and the distance to fp32."""
    kept_types = {node.op_type for node in graph.model.graph.node
                  if node.op_type in op_kept and graph.has_float_output(node.name)}
    outputs = {name: {"max_abs_diff": stats.max_abs_diff, "cosine": stats.cosine}
               for name, stats in result.outputs.items()}
    return {
        "dtype": half.name,
        "kept_op_types": sorted(kept_types),  # those of the graph's float nodes
        "kept_nodes": sorted(searched),
        "kept_node_count": len(searched),
        "index_math_nodes": len(index_nodes),
        "rounds": rounds,
        "feeds": feed_count,
        "rtol": rtol,
        "atol": atol,
        "max_abs_diff": max((o["max_abs_diff"] for o in outputs.values()), default=0.0),
        "cosine": min((o["cosine"] for o in outputs.values()), default=1.0),
        "outputs": outputs,
        "evaluated_as": "fp32 kernels with every half-stored value rounded to " + half.name,
    }


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose every node has a unique name: the converter keeps nodes in fp32 by name."""
    named = copy_model(model)
    seen: set[str] = set()
    for index, node in enumerate(named.graph.node):
        if not node.name or node.name in seen:
            stem = node.name or f"{node.op_type}_{index}"
            name, suffix = stem, 1
            while name in seen:
                name, suffix = f"{stem}_{suffix}", suffix + 1
            node.name = name
        seen.add(node.name)
    return named


def _index_math(model: onnx.ModelProto, graph: GraphInfo) -> set[str]:
    """Float nodes whose result is cast to an integer (T5's relative-position buckets, say).

    Truncation turns a half rounding error into an off-by-one index, so the float arithmetic feeding
    such a Cast, constants included, stays fp32.
    """
    found: set[str] = set()
    stack = [node.input[0] for node in model.graph.node
             if node.op_type == "Cast" and cast_target(node) in _INTEGER_TYPES and node.input[0] in graph.floats]
    while stack:
        producer = graph.producer.get(stack.pop())
        if producer is None or producer in found:
            continue
        found.add(producer)
        stack.extend(v for v in graph.inputs[producer] if v in graph.floats)
    return found
