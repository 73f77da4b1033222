"""The conversion of an fp32 graph to fp16 or bf16, with chosen op types and nodes left in fp32.

fp16 is onnxruntime's converter (through OnnxModel, whose symbolic shape inference types the fused
com.microsoft ops, and which drops the Cast pairs between neighbouring fp32 nodes). bf16 reuses that
conversion and relabels it: neither onnxruntime's converter (its bf16 flag only retypes the fp32 nodes)
nor onnxconverter-common converts to bf16, so the fp16 graph's structure is kept and its types, Casts
and weights are rewritten to bf16, weights rounded from the fp32 originals.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.errors import HotrodError, first_line
from hotrod.optimize.emulate import Runner, copy_model

if TYPE_CHECKING:  # specs are passed in: `hotrod.precisions` lowers through these passes, never the reverse
    from hotrod.precisions import Half


def converter_default_blocks() -> set[str]:
    """The op types onnxruntime's converter keeps in fp32 by default (an op block list replaces them)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return set(DEFAULT_OP_BLOCK_LIST)


def convert(model: onnx.ModelProto, half: Half, op_block: Iterable[str], node_block: Iterable[str]) -> onnx.ModelProto:
    """`model` in `half`, with the op types `op_block` and the nodes named in `node_block` left in fp32;
    graph inputs and outputs stay fp32, so the runtime's interface does not change."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    wrapped = OnnxModel(copy_model(model))
    wrapped.convert_float_to_float16(keep_io_types=True, op_block_list=sorted(op_block),
                                     node_block_list=sorted(node_block))
    _drop_repeated_casts(wrapped.model)
    wrapped.topological_sort()
    converted = wrapped.model
    _record_types(converted)
    if half.onnx_type != TensorProto.FLOAT16:
        _relabel(converted, model, half)
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
        session = Runner(model, values).session
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
    (onnx-ir's common-subexpression pass cannot do it: it refuses to read a graph with one value
    produced twice.)
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


def _relabel(converted: onnx.ModelProto, original: onnx.ModelProto, half: Half) -> None:
    """Rewrite an fp16 conversion of `original` in `half` (bf16), in place."""
    weights = {t.name: t for t in original.graph.initializer}
    for index, tensor in enumerate(converted.graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16:
            source = weights.get(tensor.name, tensor)
            converted.graph.initializer[index].CopyFrom(_half_tensor(source, half))
    originals = {node.name: node for node in original.graph.node}
    for node in converted.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.CopyFrom(_half_tensor(_original_attribute(originals.get(node.name), attr.name, attr.t), half))
            elif node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = half.onnx_type
    graph = converted.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT16:
            info.type.tensor_type.elem_type = half.onnx_type


def _original_attribute(node: onnx.NodeProto | None, name: str, fallback: onnx.TensorProto) -> onnx.TensorProto:
    if node is not None:
        for attr in node.attribute:
            if attr.name == name and attr.type == onnx.AttributeProto.TENSOR:
                return attr.t
    return fallback


def _half_tensor(tensor: onnx.TensorProto, half: Half) -> onnx.TensorProto:
    """`tensor` rounded to `half`, saturating at its largest finite value (as the fp16 converter does), so
    that a finfo(float32).min mask stays finite: 0 * -inf would be NaN."""
    values = numpy_helper.to_array(tensor).astype(np.float32)
    values = np.where(np.isfinite(values), np.clip(values, -half.max_finite, half.max_finite), values)
    return numpy_helper.from_array(values.astype(half.numpy_type), tensor.name)
