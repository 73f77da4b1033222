"""Exporting a lean module's graphs to ONNX with dynamic batch and sequence axes.

The TorchScript-based exporter (`dynamo=False`) is used on purpose: the lean modules are plain
traceable code, the exporter is fast, and it emits the operator patterns ONNX Runtime's transformer
fusions recognise. Graphs whose weights pass 2 GB are saved with their tensors in one external file.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from hotrod.contracts import FLOAT32, GraphIO

OPSET = 17
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**24  # protobuf's 2 GB limit, with headroom for the graph itself
_DUMMY_SIZES = {"batch": 2, "sources": 1, "sequence": 3, "past_sequence": 4, "encoder_sequence": 5,
                "cache_capacity": 6, "logits_sequence": 1}


def dummy_inputs(io: GraphIO, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """Small inputs of the contract's shapes; sizes differ per axis so the trace cannot confuse them."""
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for spec in io.inputs:
        shape = [_DUMMY_SIZES[a] if isinstance(a, str) else a for a in spec.axes]
        if spec.dtype == FLOAT32:
            tensors.append(torch.randn(shape, generator=generator) * 0.1)
        elif spec.name == "seqlens_k":  # a first prompt: rows of 3 and 2 tokens
            tensors.append(torch.arange(_DUMMY_SIZES["sequence"] - 1, 0, -1, dtype=torch.int32)[: shape[0]])
        elif spec.name == "total_sequence_length":
            tensors.append(torch.tensor(_DUMMY_SIZES["sequence"], dtype=torch.int32))
        elif spec.name == "logits_positions":
            tensors.append(torch.full(shape, _DUMMY_SIZES["sequence"] - 2, dtype=torch.long))
        elif spec.name.endswith("attention_mask"):
            tensors.append(torch.ones(shape, dtype=torch.long))
        elif spec.name == "position_ids":
            start = _DUMMY_SIZES["past_sequence"]
            tensors.append(torch.arange(start, start + shape[1]).expand(shape).contiguous())
        elif spec.name == "token_type_ids":
            tensors.append(torch.zeros(shape, dtype=torch.long))
        else:
            tensors.append(torch.randint(0, vocab_size, shape, generator=generator))
    return tuple(tensors)


def export_graph(module: torch.nn.Module, io: GraphIO, vocab_size: int, path: Path) -> Path | None:
    """Write `path` (and `path`.data when large); returns the external data file, if any."""
    dynamic_axes = {
        spec.name: {i: axis for i, axis in enumerate(spec.axes) if isinstance(axis, str)}
        for spec in (*io.inputs, *io.outputs)
    }
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        raw = Path(scratch) / path.name
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module.eval(),
                dummy_inputs(io, vocab_size),
                str(raw),
                input_names=list(io.input_names),
                output_names=list(io.output_names),
                dynamic_axes=dynamic_axes,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        model = onnx.load(str(raw), load_external_data=True)
        _check_io(model, io)
        return save_model(constants_to_initializers(model), path)


def constants_to_initializers(model: onnx.ModelProto, min_elements: int = 1024) -> onnx.ModelProto:
    """Turn Constant nodes of `min_elements` or more into initializers (onnx-ir's pass).

    Weights built at trace time (such as a concatenated QKV projection) are traced as Constant nodes;
    the quantizers and the external-data writer only see initializers, so they are moved there.
    """
    import onnx_ir
    from onnx_ir.passes.common import LiftConstantsToInitializersPass

    graph = onnx_ir.from_proto(model)
    LiftConstantsToInitializersPass(size_limit=min_elements)(graph)
    return onnx_ir.to_proto(graph)


def save_model(model: onnx.ModelProto, path: Path) -> Path | None:
    """Save inline below 2 GB, else with every tensor in `<name>.data` beside the graph."""
    weights = sum(t.ByteSize() for t in model.graph.initializer)
    if weights < EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, str(path))
        return None
    data = path.with_name(path.name + ".data")
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name)
    return data


def _check_io(model: onnx.ModelProto, io: GraphIO) -> None:
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    if inputs != io.input_names or outputs != io.output_names:
        raise RuntimeError(
            f"exported graph {io.name} has inputs {inputs} and outputs {outputs}; "
            f"the contract says {io.input_names} and {io.output_names}"
        )
