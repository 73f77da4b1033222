"""Weight quantization with ONNX Runtime's quantization tools.

- int8: dynamic quantization with per-channel int8 weights for every MatMul with a constant weight,
  the LM head included; activations are quantized per call, so no calibration is needed.
- int4: block-wise (32) symmetric int4 weights through MatMulNBits, computed with int8 activations
  (accuracy level 4); batch-1 decoding is bound by weight bytes, and this reads an eighth of fp32's.
In both, the token embedding stays fp32: a Gather reads one row per token, so quantizing it saves
memory but no time, and costs accuracy.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from hotrod.export.onnx import EXTERNAL_DATA_THRESHOLD

QUANTIZED = {"int8": "int8 per-channel (dynamic)", "int4": "int4 block-32 symmetric (MatMulNBits)"}


def describe(precision: str) -> dict[str, str]:
    """What the manifest says about where each kind of weight ended up."""
    weights = QUANTIZED.get(precision, precision)
    return {"matmul_weights": weights, "lm_head": weights, "embeddings": "fp32"}


def quantize(model: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    if precision == "int8":
        return _int8_dynamic(model)
    if precision == "int4":
        return _int4_weight_only(model)
    return model


def _int8_dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as scratch:
        src, dst = Path(scratch) / "in.onnx", Path(scratch) / "out.onnx"
        large = sum(t.ByteSize() for t in model.graph.initializer) >= EXTERNAL_DATA_THRESHOLD
        onnx.save_model(model, str(src), save_as_external_data=large, all_tensors_to_one_file=True)
        quantize_dynamic(
            str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
            use_external_data_format=large,
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        return onnx.load(str(dst), load_external_data=True)


def _int4_weight_only(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    return quantizer.model.model  # the pass pipeline prunes the fp32 originals it leaves behind


def prune_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop weights no node reads any more (the quantizers leave the fp32 originals behind)."""
    used = set(_inputs(model.graph)) | {output.name for output in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return model


def _inputs(graph: onnx.GraphProto):
    for node in graph.node:
        yield from node.input
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _inputs(attr.g)
            for subgraph in attr.graphs:
                yield from _inputs(subgraph)
