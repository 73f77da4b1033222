"""Mixed precision: fp16 / bf16 graphs that never produce NaN or Inf, checked on real inputs.

Half precision halves the bytes every step reads and runs on tensor cores, but fp16 tops out at 65504:
a T5 feed-forward or a residual stream can grow past it, and the graph then returns Inf, then NaN.
Which nodes do so depends on the weights, so each graph is searched with inputs recorded from the fp32
model (`hotrod.optimize.calibration.capture_feeds`):

1. convert, keeping KEEP_FP32_OPS, index arithmetic and the nodes found so far in fp32; graph inputs and
   outputs stay fp32, so the runtime's interface does not change;
2. run the fp32 graph and the half graph on every feed with every intermediate value exposed;
3. each value that first goes non-finite in half, or that fp32 shows to be beyond the half range while
   the half graph holds it in half, keeps its node in fp32; a node already kept whose output is still
   too large to be stored in half keeps its consumers instead, so the fp32 island grows until the value
   is back in range (a norm, usually);
4. repeat until every output is finite and within tolerance of fp32.

How the half graph is run: onnxruntime's CPU provider cannot show half overflow. In 1.31 it has half
kernels only for data movement (Gather, Concat, Transpose, Reshape) and the LayerNormalization family;
it wraps every other fp16 node (MatMul, Add, Mul, Where, Softmax, FastGelu, ...) in Casts to fp32 and
drops the Casts between neighbours, so a chain of them runs as one fp32 island and an intermediate
overflow never appears (MatMul giving 80000 followed by Add -60000 returns 20000, not Inf); bf16 graphs
do not load at all (no MatMul or Add kernel). So the half graph is evaluated as an fp32 graph in which
every value the half graph stores in half is rounded through a Cast to the half type and back
(round-to-nearest-even, overflow to +-Inf). That is what a device with half kernels stores as long as
its kernels accumulate in fp32, which CUDA's MatMul (cuBLAS, fp32 compute), norm and Softmax kernels do;
it runs on any machine, with the same answer on each.
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import ml_dtypes  # numpy's bfloat16; onnx itself depends on it
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.errors import HotrodError, first_line
from hotrod.optimize.calibration import graph_feed

KEEP_FP32_OPS: tuple[str, ...] = (
    "Pow",  # x**2 of a hand-written norm overflows fp16 once |x| > 256
    "ReduceMean",  # the mean of those squares needs fp32's range; the variance sets the whole layer's scale
    "Sqrt",  # the root of a variance: small variances lose their digits in half
    "Softmax",  # where scores meet the mask's large negatives; fp32 keeps the exponentials and their sum exact
    "Relu",  # T5's feed-forward activation: when the search keeps wi or wo, the path through it stays fp32
    "ReduceSum",  # sums of squares or exponentials overflow half long before their terms do
    "Log",  # T5's relative-position buckets: half rounding of log(distance) moves a distance to the next bucket
    "Exp",  # exp overflows fp16 above 11
    # The decoder's KV cache is an fp32 buffer the op updates in place; in half it would read and write a
    # cast copy, and the step's keys and values would never reach the buffer.
    "GroupQueryAttention",
    "ScatterND",  # the same buffers, written in place by the GPU form of that attention (optimize/portable.py)
)
MAX_ROUNDS = 8
# fp32 values beyond this are masking sentinels (finfo(float32).min), not activations; the converter
# clamps them to the half range on purpose, and a softmax reads either as "minus infinity".
SENTINEL = 1e30
_INTEGER_TYPES = {
    TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT64,
    TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8, TensorProto.BOOL,
}


@dataclass(frozen=True)
class HalfType:
    """One half type: its ONNX and numpy types, its largest finite value and the default tolerance.

    The tolerance is on each output's largest absolute difference from fp32, relative to the output's
    largest magnitude: bf16 keeps 8 significant bits to fp16's 11, so it gets a wider band.
    """

    name: str
    onnx_type: int
    numpy_type: type
    max_finite: float
    rtol: float
    atol: float


HALF_TYPES = {
    "fp16": HalfType("fp16", TensorProto.FLOAT16, np.float16, 65504.0, 1e-2, 1e-3),
    "bf16": HalfType("bf16", TensorProto.BFLOAT16, ml_dtypes.bfloat16,
                     float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 5e-2, 1e-2),
}


def half_type(dtype: str) -> HalfType:
    if dtype not in HALF_TYPES:
        raise HotrodError(f"unknown half precision {dtype!r}; choose from {', '.join(HALF_TYPES)}")
    return HALF_TYPES[dtype]


# -- the search ---------------------------------------------------------------------------------------


def to_half(model: onnx.ModelProto, dtype: str, feeds: Sequence[Mapping[str, np.ndarray]],
            rtol: float | None = None, atol: float | None = None, max_rounds: int = MAX_ROUNDS, *,
            name: str | None = None) -> tuple[onnx.ModelProto, dict]:
    """Convert a (fused, fp32) graph to fp16 or bf16 ("fp16"|"bf16"), keeping KEEP_FP32_OPS and every node the
    search finds in fp32.

    `feeds` are real inputs of this graph; the search keeps nodes until every output is finite and each
    output's largest difference from fp32 is within `atol + rtol * (its largest magnitude)` on all of
    them (defaults per type: HALF_TYPES). Returns the half graph (fp32 inputs and outputs) and the report
    for the manifest; raises HotrodError, naming the graph `name`, when `max_rounds` rounds do not get there.
    """
    half = half_type(dtype)
    rtol = half.rtol if rtol is None else rtol
    atol = half.atol if atol is None else atol
    if not feeds:
        raise HotrodError("mixed precision needs at least one recorded input of the graph")
    if max_rounds < 1:
        raise HotrodError(f"max_rounds must be >= 1, got {max_rounds}")
    base = _named(model)
    graph = _GraphInfo(base)
    feeds = [graph_feed([i.name for i in base.graph.input], feed) for feed in feeds]
    reference = _Runner(base, graph.all_values())
    graph.learn_types(reference.run(feeds[0]))
    op_kept = set(KEEP_FP32_OPS) | _converter_default_blocks()
    kept_types = {node.name for node in base.graph.node if node.op_type in op_kept}
    index_nodes = _index_math(base, graph)
    searched: set[str] = set()
    for round_number in range(1, max_rounds + 1):
        converted = convert(base, half, op_kept, index_nodes | searched)
        result = _compare(reference, converted, half, graph, feeds)
        if result.within(rtol, atol):
            report = _report(graph, half, op_kept, searched, index_nodes, round_number, result, rtol, atol, len(feeds))
            return converted, report
        fixes = _fixes(result, graph, kept_types | index_nodes | searched)
        if not fixes:
            break
        searched |= fixes
    raise HotrodError(f"{half.name} {name or model.graph.name or 'graph'}: {result.failure(rtol, atol)} "
                      f"after {round_number} round(s) keeping {len(searched)} node(s) in fp32")


def _fixes(result: _Comparison, graph: _GraphInfo, kept: set[str]) -> set[str]:
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


def _report(graph: _GraphInfo, half: HalfType, op_kept: set[str], searched: set[str], index_nodes: set[str],
            rounds: int, result: _Comparison, rtol: float, atol: float, feed_count: int) -> dict:
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


# -- the graph ----------------------------------------------------------------------------------------


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose every node has a unique name: the converter keeps nodes in fp32 by name."""
    named = _copy(model)
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


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


@dataclass
class _GraphInfo:
    """Who produces and who reads each value of the fp32 graph, and which values are float."""

    model: onnx.ModelProto
    producer: dict[str, str] = field(default_factory=dict)
    consumers: dict[str, list[str]] = field(default_factory=dict)
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)
    floats: set[str] = field(default_factory=set)
    float_inputs: list[str] = field(default_factory=list)

    def __post_init__(self):
        for node in self.model.graph.node:
            self.inputs[node.name] = [i for i in node.input if i]
            self.outputs[node.name] = [o for o in node.output if o]
            for value in self.outputs[node.name]:
                self.producer[value] = node.name
            for value in self.inputs[node.name]:
                self.consumers.setdefault(value, []).append(node.name)
        graph = self.model.graph
        self.float_inputs = [i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT]
        self.floats = set(self.float_inputs) | {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT}

    def all_values(self) -> list[str]:
        return [value for values in self.outputs.values() for value in values]

    def learn_types(self, values: Mapping[str, np.ndarray]) -> None:
        """Float values, as one fp32 run shows them (ONNX's own inference does not know the fused ops)."""
        self.floats |= {name for name, array in values.items() if array.dtype == np.float32}

    def has_float_output(self, node: str) -> bool:
        return any(value in self.floats for value in self.outputs[node])


def _index_math(model: onnx.ModelProto, graph: _GraphInfo) -> set[str]:
    """Float nodes whose result is cast to an integer (T5's relative-position buckets, say).

    Truncation turns a half rounding error into an off-by-one index, so the float arithmetic feeding
    such a Cast, constants included, stays fp32.
    """
    found: set[str] = set()
    stack = [node.input[0] for node in model.graph.node
             if node.op_type == "Cast" and _cast_target(node) in _INTEGER_TYPES and node.input[0] in graph.floats]
    while stack:
        producer = graph.producer.get(stack.pop())
        if producer is None or producer in found:
            continue
        found.add(producer)
        stack.extend(v for v in graph.inputs[producer] if v in graph.floats)
    return found


def _cast_target(node: onnx.NodeProto) -> int:
    return next(attr.i for attr in node.attribute if attr.name == "to")


# -- conversion ---------------------------------------------------------------------------------------


def _converter_default_blocks() -> set[str]:
    """The op types onnxruntime's converter keeps in fp32 by default (an op block list replaces them)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return set(DEFAULT_OP_BLOCK_LIST)


def convert(model: onnx.ModelProto, half: HalfType, op_block: Iterable[str], node_block: Iterable[str]) -> onnx.ModelProto:
    """`model` in `half`, with the op types `op_block` and the nodes named in `node_block` left in fp32.

    fp16 is onnxruntime's converter (through OnnxModel, whose symbolic shape inference types the fused
    com.microsoft ops, and which drops the Cast pairs between neighbouring fp32 nodes). bf16 reuses that
    conversion and relabels it: neither onnxruntime's converter (its bf16 flag only retypes the fp32
    nodes) nor onnxconverter-common converts to bf16, so the fp16 graph's structure is kept and its
    types, Casts and weights are rewritten to bf16, weights rounded from the fp32 originals.
    """
    from onnxruntime.transformers.onnx_model import OnnxModel

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    wrapped = OnnxModel(_copy(model))
    wrapped.convert_float_to_float16(keep_io_types=True, op_block_list=sorted(op_block),
                                     node_block_list=sorted(node_block))
    _drop_repeated_casts(wrapped.model)
    wrapped.topological_sort()
    converted = wrapped.model
    _record_types(converted)
    if half.onnx_type == TensorProto.BFLOAT16:
        _relabel_as_bf16(converted, model)
    return converted


def _record_types(model: onnx.ModelProto) -> None:
    """Load the fp16 graph in onnxruntime and write the type it infers for every value into value_info.

    Its CPU provider loads any fp16 graph (computing what it has no half kernel for in fp32), so a
    converter fault surfaces here rather than when the artifact loads, and every value gets a type,
    fused com.microsoft ops included, which `emulate` relies on. The bf16 graph is this graph
    relabelled, so the check and the types cover it too.
    """
    values = [value for node in model.graph.node for value in node.output if value]
    try:
        session = _Runner(model, values).session
    except Exception as exc:  # noqa: BLE001  (onnxruntime raises its own exception types)
        raise HotrodError(f"the fp16 converter produced a graph onnxruntime refuses: {first_line(exc)}") from None
    types = {o.name: _ORT_TYPES.get(o.type) for o in session.get_outputs()}
    graph = model.graph
    interface = {v.name for v in [*graph.input, *graph.output]}
    for info in graph.value_info:
        if types.get(info.name):
            info.type.tensor_type.elem_type = types.pop(info.name)
    graph.value_info.extend(helper.make_tensor_value_info(name, elem_type, None) for name, elem_type in types.items()
                            if elem_type and name not in interface)


_ORT_TYPES = {f"tensor({name.lower()})": value for name, value in TensorProto.DataType.items()}


def _drop_repeated_casts(model: onnx.ModelProto) -> None:
    """Remove the second and later copies of a Cast the converter inserts once per fp32 reader.

    A half value read by two kept nodes gets one `<value>_cast_to_fp32` Cast per reader, all with the
    same name, input and output, which onnxruntime refuses as a graph; the first copy serves them all.
    """
    seen: set[bytes] = set()
    keep = []
    for node in model.graph.node:
        if node.op_type == "Cast":
            key = node.SerializeToString()
            if key in seen:
                continue
            seen.add(key)
        keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)


def _relabel_as_bf16(converted: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Rewrite an fp16 conversion of `original` as bf16, in place."""
    weights = {t.name: t for t in original.graph.initializer}
    for index, tensor in enumerate(converted.graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16:
            source = weights.get(tensor.name, tensor)
            converted.graph.initializer[index].CopyFrom(_bf16_tensor(source))
    originals = {node.name: node for node in original.graph.node}
    for node in converted.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.CopyFrom(_bf16_tensor(_original_attribute(originals.get(node.name), attr.name, attr.t)))
            elif node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.BFLOAT16
    graph = converted.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT16:
            info.type.tensor_type.elem_type = TensorProto.BFLOAT16


def _original_attribute(node: onnx.NodeProto | None, name: str, fallback: onnx.TensorProto) -> onnx.TensorProto:
    if node is not None:
        for attr in node.attribute:
            if attr.name == name and attr.type == onnx.AttributeProto.TENSOR:
                return attr.t
    return fallback


def _bf16_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """`tensor` rounded to bf16, saturating at its largest finite value (as the fp16 converter does), so
    that a finfo(float32).min mask stays finite: 0 * -inf would be NaN."""
    limit = HALF_TYPES["bf16"].max_finite
    values = numpy_helper.to_array(tensor).astype(np.float32)
    values = np.where(np.isfinite(values), np.clip(values, -limit, limit), values)
    return numpy_helper.from_array(values.astype(ml_dtypes.bfloat16), tensor.name)


# -- evaluation ---------------------------------------------------------------------------------------


def emulate(converted: onnx.ModelProto, half: HalfType) -> tuple[onnx.ModelProto, set[str]]:
    """An fp32 graph that computes what `converted` computes on a device with half kernels.

    Every value `converted` holds in half (a Cast to half, a node with half outputs) is rounded through a
    Cast to the half type and back under its own name; half weights and constants become their exact fp32
    values. A node's outputs are known to be half by their value_info, which `convert` records for every
    value. Returns the graph and the names of the values held in half.
    """
    model = _copy(converted)
    graph = model.graph
    types = {info.name: info.type.tensor_type.elem_type for info in [*graph.input, *graph.output, *graph.value_info]}
    held: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == half.onnx_type:
                attr.t.CopyFrom(_fp32_tensor(attr.t))
        nodes.append(node)
        is_half_cast = node.op_type == "Cast" and _cast_target(node) == half.onnx_type
        for index, value in enumerate(node.output):
            if not value or not (is_half_cast or (node.op_type != "Cast" and types.get(value) == half.onnx_type)):
                continue
            rounded = f"{value}/{half.name}"
            if is_half_cast:
                node.output[index] = rounded
            else:
                node.output[index] = f"{value}/fp32"
                nodes.append(helper.make_node("Cast", [f"{value}/fp32"], [rounded], to=half.onnx_type,
                                              name=f"{value}/round_{half.name}"))
            nodes.append(helper.make_node("Cast", [rounded], [value], to=TensorProto.FLOAT, name=f"{value}/widen"))
            held.add(value)
    del graph.node[:]
    graph.node.extend(nodes)
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == half.onnx_type:
            graph.initializer[index].CopyFrom(_fp32_tensor(tensor))
    del graph.value_info[:]
    for info in [*graph.input, *graph.output]:
        if info.type.tensor_type.elem_type == half.onnx_type:
            info.type.tensor_type.elem_type = TensorProto.FLOAT
    return model, held


def _fp32_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


class _Runner:
    """An onnxruntime CPU session of `model` that also returns the values `watch` names.

    Graph optimizations are off, so that every value exists and no Cast pair is folded away.
    """

    def __init__(self, model: onnx.ModelProto, watch: Iterable[str], owned: bool = False):
        import onnxruntime as ort

        from hotrod.export.onnx import EXTERNAL_DATA_THRESHOLD
        from hotrod.runtime.base import cpu_threads

        exposed = model if owned else _copy(model)
        present = {o.name for o in exposed.graph.output}
        exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in dict.fromkeys(watch)
                                    if name not in present)
        self.names = [o.name for o in exposed.graph.output]
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = cpu_threads(0)
        options.log_severity_level = 3
        self._scratch = None
        if sum(t.ByteSize() for t in exposed.graph.initializer) < EXTERNAL_DATA_THRESHOLD:
            source = exposed.SerializeToString()
        else:  # protobuf cannot hold it in one message
            self._scratch = tempfile.TemporaryDirectory(prefix="hotrod-precision-")
            source = str(Path(self._scratch.name) / "graph.onnx")
            onnx.save_model(exposed, source, save_as_external_data=True, location="graph.onnx.data")
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(self.names, dict(feed))))


@dataclass
class _OutputStats:
    """One graph output's distance to fp32 over all feeds."""

    max_abs_diff: float = 0.0
    max_magnitude: float = 0.0
    nonfinite: bool = False
    dot: float = 0.0
    norm_ref: float = 0.0
    norm_half: float = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        usable = _ordinary(ref)
        ref, got = ref[usable].astype(np.float64), got[usable].astype(np.float64)
        if not np.isfinite(got).all():
            self.nonfinite = True
            return
        if ref.size:
            self.max_abs_diff = max(self.max_abs_diff, float(np.abs(ref - got).max()))
            self.max_magnitude = max(self.max_magnitude, float(np.abs(ref).max()))
        self.dot += float(ref @ got)
        self.norm_ref += float(ref @ ref)
        self.norm_half += float(got @ got)

    @property
    def cosine(self) -> float:
        if self.norm_ref == 0.0 and self.norm_half == 0.0:
            return 1.0
        return self.dot / math.sqrt(self.norm_ref * self.norm_half) if self.norm_ref and self.norm_half else 0.0

    def within(self, rtol: float, atol: float) -> bool:
        return not self.nonfinite and self.max_abs_diff <= atol + rtol * self.max_magnitude


@dataclass
class _Comparison:
    """One round: the values that go non-finite in half, those fp32 shows are beyond the half range where
    the half graph stores them in half, and each output's distance to fp32."""

    nonfinite: set[str]
    too_large: set[str]
    outputs: dict[str, _OutputStats]

    def within(self, rtol: float, atol: float) -> bool:
        return not (self.nonfinite or self.too_large) and all(s.within(rtol, atol) for s in self.outputs.values())

    def culprits(self, graph: _GraphInfo) -> list[str]:
        """Every value too large for half (fp32 shows each directly), and the non-finite values whose
        producer reads no failing value: where an Inf starts, rather than everything downstream of it."""
        failing = self.nonfinite | self.too_large
        starts = {v for v in self.nonfinite
                  if not any(i in failing for i in graph.inputs.get(graph.producer.get(v, ""), ()))}
        return sorted(self.too_large | starts)

    def failure(self, rtol: float, atol: float) -> str:
        failing = sorted(self.nonfinite | self.too_large)
        if failing:
            more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
            return f"values still overflow: {', '.join(failing[:3])}{more}"
        bad = {name: s for name, s in self.outputs.items() if not s.within(rtol, atol)}
        return "no value overflows, but outputs differ from fp32 beyond tolerance: " + ", ".join(
            f"{name} (max abs diff {s.max_abs_diff:.3g}, allowed {atol + rtol * s.max_magnitude:.3g})"
            for name, s in bad.items())


def _compare(reference: _Runner, converted: onnx.ModelProto, half: HalfType, graph: _GraphInfo,
             feeds: Sequence[Mapping[str, np.ndarray]]) -> _Comparison:
    """Run fp32 and emulated half on every feed, one feed at a time (all intermediates of all feeds at
    once would not fit for a large model), and collect the failing values and the outputs' error."""
    emulated, held = emulate(converted, half)
    emulated_values = {o for node in emulated.graph.node for o in node.output}
    watched = {value: _half_name(value, emulated_values) for value in graph.all_values() if value in graph.floats}
    watched = {value: name for value, name in watched.items() if name is not None}
    runner = _Runner(emulated, watched.values(), owned=True)
    output_names = [o.name for o in graph.model.graph.output]
    result = _Comparison(set(), set(), {name: _OutputStats() for name in output_names})
    for feed in feeds:
        result.too_large |= {name for name in graph.float_inputs if _too_large(feed[name], half)}
        ref, got = reference.run(feed), runner.run(feed)
        for value, name in watched.items():
            usable = _ordinary(ref[value])
            if value not in result.nonfinite and not _finite_where(got[name], usable, ref[value].shape):
                result.nonfinite.add(value)
            if name in held and value not in result.too_large and _too_large(ref[value], half):
                result.too_large.add(value)
        for name in output_names:
            result.outputs[name].add(ref[name], got[name])
    return result


def _half_name(value: str, present: set[str]) -> str | None:
    """The name `value` has in the half graph: its own, or, for an fp32 node whose only readers run in
    fp32 too, the converter's name for the fp32 result it no longer casts to half."""
    for name in (value, f"{value}_cast_to_fp16"):
        if name in present:
            return name
    return None


def _ordinary(ref: np.ndarray) -> np.ndarray:
    """Elements that are neither non-finite nor masking sentinels in fp32."""
    return np.isfinite(ref) & (np.abs(ref) < SENTINEL)


def _too_large(ref: np.ndarray, half: HalfType) -> bool:
    """Whether fp32 holds an ordinary number beyond the half type's largest finite value."""
    return bool(np.abs(ref[_ordinary(ref)]).max(initial=0.0) > half.max_finite)


def _finite_where(got: np.ndarray, usable: np.ndarray, shape: tuple) -> bool:
    return got.shape == shape and bool(np.isfinite(got[usable]).all())


# -- device support -----------------------------------------------------------------------------------

# The compute ops of hotrod's fused graphs; the data movement ops (Gather, Reshape, ...) run in any type.
GRAPH_OPS = ("MatMul", "Add", "Mul", "Where", "FastGelu", "LayerNormalization", "SkipLayerNormalization",
             "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


def half_supported(dtype: str, device: str, ops: Sequence[str] = GRAPH_OPS) -> bool:
    """Whether onnxruntime on `device` ("cpu" or "cuda") runs `ops` in `dtype` with its own half kernels.

    Asked of the installed onnxruntime with a small probe graph, not from a table, so it stays true as
    kernels are added. A session that loads but has onnxruntime wrap nodes in Casts to fp32 (its CPU
    provider with fp16) does not count: the graph then computes in fp32, slower than the fp32 graph.
    """
    half = half_type(dtype)
    if device not in ("cpu", "cuda"):
        raise HotrodError(f"unknown device {device!r}; choose from cpu, cuda")
    return _probe(half.name, device, tuple(sorted(set(ops))))


_PROBE_CASTS = ("probe_input", "probe_output")


@cache
def _probe(dtype: str, device: str, ops: tuple[str, ...]) -> bool:
    import onnxruntime as ort

    provider = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}[device]
    if provider not in ort.get_available_providers():
        return False
    half = HALF_TYPES[dtype]
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


def _probe_graph(half: HalfType, ops: Sequence[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A chain [1, 2, 8] -> [1, 2, 8] that passes through one node of each op in `ops`, all in `half`.

    Its input and output are fp32, cast inside the graph (onnxruntime's Python API takes no bfloat16
    arrays); those two Casts are named in _PROBE_CASTS, so that any other Cast is one onnxruntime added.
    """
    rng = np.random.default_rng(0)
    width = 8
    nodes = [helper.make_node("Cast", ["x"], ["h0"], to=half.onnx_type, name=_PROBE_CASTS[0])]
    weights = []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        values = rng.standard_normal(shape).astype(np.float32) * 0.1
        weights.append(numpy_helper.from_array(values.astype(half.numpy_type), name))
        return name

    current = "h0"
    for index, op in enumerate(ops):
        out = f"h{index + 1}"
        nodes.append(_probe_node(op, current, out, weight, width, index))
        current = out
    nodes.append(helper.make_node("Cast", [current], ["y"], to=TensorProto.FLOAT, name=_PROBE_CASTS[1]))
    condition = numpy_helper.from_array(np.array([True, False] * (width // 2)), "condition")
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [*weights, condition])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9)
    return model, {"x": rng.standard_normal((1, 2, width)).astype(np.float32)}


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
