"""Half graphs evaluated as a device with half kernels would evaluate them, and compared with fp32.

onnxruntime's CPU provider cannot show half overflow. In 1.31 it has half kernels only for data movement
(Gather, Concat, Transpose, Reshape) and the LayerNormalization family; it wraps every other fp16 node
(MatMul, Add, Mul, Where, Softmax, FastGelu, ...) in Casts to fp32 and drops the Casts between
neighbours, so a chain of them runs as one fp32 island and an intermediate overflow never appears
(MatMul giving 80000 followed by Add -60000 returns 20000, not Inf); bf16 graphs do not load at all (no
MatMul or Add kernel). So the half graph is evaluated as an fp32 graph in which every value the half
graph stores in half is rounded through a Cast to the half type and back (round-to-nearest-even,
overflow to +-Inf). That is what a device with half kernels stores as long as its kernels accumulate in
fp32, which CUDA's MatMul (cuBLAS, fp32 compute), norm and Softmax kernels do; it runs on any machine,
with the same answer on each.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:  # specs are passed in: `hotrod.precisions` lowers through these passes, never the reverse
    from hotrod.precisions import Half

# fp32 values beyond this are masking sentinels (finfo(float32).min), not activations; the converter
# clamps them to the half range on purpose, and a softmax reads either as "minus infinity".
SENTINEL = 1e30


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def cast_target(node: onnx.NodeProto) -> int:
    return next(attr.i for attr in node.attribute if attr.name == "to")


@dataclass
class GraphInfo:
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


def emulate(converted: onnx.ModelProto, half: Half) -> tuple[onnx.ModelProto, set[str]]:
    """An fp32 graph that computes what `converted` computes on a device with half kernels.

    Every value `converted` holds in half (a Cast to half, a node with half outputs) is rounded through a
    Cast to the half type and back under its own name; half weights and constants become their exact fp32
    values. A node's outputs are known to be half by their value_info, which the conversion records for
    every value. Returns the graph and the names of the values held in half.
    """
    model = copy_model(converted)
    graph = model.graph
    types = {info.name: info.type.tensor_type.elem_type for info in [*graph.input, *graph.output, *graph.value_info]}
    held: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == half.onnx_type:
                attr.t.CopyFrom(_fp32_tensor(attr.t))
        nodes.append(node)
        is_half_cast = node.op_type == "Cast" and cast_target(node) == half.onnx_type
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


class Runner:
    """An onnxruntime CPU session of `model` that also returns the values `watch` names.

    Graph optimizations are off, so that every value exists and no Cast pair is folded away.
    """

    def __init__(self, model: onnx.ModelProto, watch: Iterable[str], owned: bool = False):
        import onnxruntime as ort

        from hotrod.export.onnx import EXTERNAL_DATA_THRESHOLD
        from hotrod.runtime.base import cpu_threads

        exposed = model if owned else copy_model(model)
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
class OutputStats:
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
class Comparison:
    """One round: the values that go non-finite in half, those fp32 shows are beyond the half range where
    the half graph stores them in half, and each output's distance to fp32."""

    nonfinite: set[str]
    too_large: set[str]
    outputs: dict[str, OutputStats]

    def within(self, rtol: float, atol: float) -> bool:
        return not (self.nonfinite or self.too_large) and all(s.within(rtol, atol) for s in self.outputs.values())

    def culprits(self, graph: GraphInfo) -> list[str]:
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


def compare(reference: Runner, converted: onnx.ModelProto, half: Half, graph: GraphInfo,
            feeds: Sequence[Mapping[str, np.ndarray]]) -> Comparison:
    """Run fp32 and emulated half on every feed, one feed at a time (all intermediates of all feeds at
    once would not fit for a large model), and collect the failing values and the outputs' error."""
    emulated, held = emulate(converted, half)
    emulated_values = {o for node in emulated.graph.node for o in node.output}
    watched = {value: _half_name(value, emulated_values) for value in graph.all_values() if value in graph.floats}
    watched = {value: name for value, name in watched.items() if name is not None}
    runner = Runner(emulated, watched.values(), owned=True)
    output_names = [o.name for o in graph.model.graph.output]
    result = Comparison(set(), set(), {name: OutputStats() for name in output_names})
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


def _too_large(ref: np.ndarray, half: Half) -> bool:
    """Whether fp32 holds an ordinary number beyond the half type's largest finite value."""
    return bool(np.abs(ref[_ordinary(ref)]).max(initial=0.0) > half.max_finite)


def _finite_where(got: np.ndarray, usable: np.ndarray, shape: tuple) -> bool:
    return got.shape == shape and bool(np.isfinite(got[usable]).all())
