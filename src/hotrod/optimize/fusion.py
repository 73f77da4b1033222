"""Kernel fusion: attention from the exporter, everything else from ONNX Runtime's transformer optimizer.

Attention is emitted fused by the exporter itself (`hotrod.models.attention`): each attention block is one
QKV MatMul, a Split and one attention node, `MultiHeadAttention` (which adds the relative-position or
mask bias and appends T5's KV cache) or, for decoder-only models, `GroupQueryAttention` (which writes
the KV cache buffers in place). Matching a traced attention subgraph afterwards is fragile (ONNX
Runtime's matcher knows transformers' own patterns, not ours), and emitting the op costs nothing.
ONNX Runtime's optimizer, the well-kept tool for the rest, then fuses LayerNorm / RMS norm, residual +
norm (SkipLayerNormalization, SkipSimplifiedLayerNormalization) and bias + GELU (FastGelu, BiasGelu);
hotrod runs it with the family's optimizer model type.

On the CPU, two of those fusions are left out of the graphs that read whole inputs (encoders, prompts)
because ONNX Runtime's CPU kernels for them (SkipLayerNormalization, BiasGelu) are slower than the
standard ops they replace (Add + Add + LayerNormalization, Add + Gelu), and so are the encoders and
generations that run them. ONNX Runtime does not fuse the first back when the session
starts, but its own BiasGeluFusion does fuse the second, so CPU sessions turn that pass off
(`hotrod.runtime.ort_sessions.CPU_DISABLED_OPTIMIZERS`). On a GPU the fused kernels are the fast ones,
and stay.

A decoding step's graph fuses the residual add and RMS norm on the CPU too (SkipSimplifiedLayerNormalization):
a step reads one token a row, where every node's dispatch counts (t5-small: 18 nodes fewer a step, and
a faster generation for it). LayerNorm's fusion stays off there too: SkipLayerNormalization was the slower
even at one token (GPT-2, in interleaved comparisons).

Where ONNX Runtime's own GroupQueryAttention kernel runs the in-place attention (`kernel_runs`), the Split
of each layer's QKV projection is folded into the op's packed-QKV input: one node fewer per layer in a
decoding step where every node's dispatch counts (GPT-2 at batch 1: 12 of 146 nodes).

For the CPU, once a graph has its precision, an encoder's self-attention (a MultiHeadAttention fed by
one Split of the QKV projection, its query and key perhaps turned by rotary embeddings, with at most an
additive bias) becomes ONNX's own Attention (opset 23),
whose CPU kernel (onnxruntime 1.23 and later) computes the same numbers faster, outputs identical to the
last bit (bert-base's int8 encoder spends less of a forward in Attention than in MultiHeadAttention). It
comes last because the tools before it read opset 17:
onnxruntime's shape inference (which half precision needs) takes any op named Attention for its own, and
its QDQ fusions of static int8 match QuantizeLinear / DequantizeLinear only up to some opset in some
releases. So the graph moves to opset 23 only where none of its standard ops changes meaning on the way
and none is a QuantizeLinear or DequantizeLinear, and half-precision graphs keep their attention.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from hotrod.optimize import graphs
from hotrod.registry import Dims

# FusionOptions switches turned off for graphs built for the CPU (see above), and those of them turned back
# on for a graph that runs every decoding step.
SLOWER_ON_CPU = ("enable_skip_layer_norm", "enable_bias_skip_layer_norm", "enable_bias_gelu")
FEWER_NODES_FOR_STEPS = ("enable_skip_layer_norm", "enable_bias_skip_layer_norm")

# Operators whose count `hotrod info` reports: what the fusion produced.
FUSED_OPS = (
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "EmbedLayerNormalization", "LayerNormalization",
    "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "FastGelu", "BiasGelu", "Gelu", "GemmFastGelu", "RotaryEmbedding",
)


def fuse(model: onnx.ModelProto, optimizer_model_type: str, dims: Dims, device: str = "cpu",
         steps: bool = False) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The graph fused for `device` and the count of each fused operator in it; `steps`: the graph runs
    every decoding step, where the residual add and norm are fused on the CPU too (see above)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    options = FusionOptions(optimizer_model_type)
    if device == "cpu":
        # SkipLayerNormalization's CPU kernel is the slower even at one token a row: only RMS norms (no
        # LayerNormalization in the graph) fuse with their residual add in a step's graph.
        rms_only = not any(node.op_type == "LayerNormalization" for node in model.graph.node)
        for switch in SLOWER_ON_CPU:
            setattr(options, switch, steps and rms_only and switch in FEWER_NODES_FOR_STEPS)
    fused = optimize_model(
        model,
        model_type=optimizer_model_type,
        num_heads=dims.num_heads,
        hidden_size=dims.hidden_size,
        opt_level=0,  # graph-level passes only; ONNX Runtime applies its own when the session starts
        optimization_options=options,
    )
    model = fused.model
    if kernel_runs(device, dims.head_dim):
        model = pack_qkv(model)
    if not any(op.domain == "com.microsoft" for op in model.opset_import):  # the fused ops live there
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return model, fused_op_counts(model)


def kernel_runs(device: str, head_dim: int) -> bool:
    """Whether ONNX Runtime runs the exported fp32 GroupQueryAttention on `device`: only its CPU provider
    has it in fp32, and only for head sizes that are a multiple of 8 (it refuses others at run time)."""
    return device == "cpu" and head_dim % 8 == 0


def pack_qkv(model: onnx.ModelProto) -> onnx.ModelProto:
    """Feed GroupQueryAttention its packed QKV ([B, S, 3*H*D], q | k | v, the op's packed form) where its
    q, k and v are the three equal parts of one Split of the last axis that nothing else reads."""
    graph = model.graph
    producer = graphs.producers(graph)
    readers = Counter(name for node in graph.node for name in node.input)
    readers.update(out.name for out in graph.output)
    constants = graphs.constants(graph)
    folded = set()
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or not all(node.input[:3]):
            continue
        split = producer.get(node.input[0])
        if split is None or split.op_type != "Split" or list(split.output) != list(node.input[:3]) \
                or any(readers[name] != 1 for name in split.output) or not _equal_last_axis_split(split, constants):
            continue
        node.input[0], node.input[1], node.input[2] = split.input[0], "", ""
        folded.add(id(split))
    kept = [node for node in graph.node if id(node) not in folded]
    # The splits' sizes go too, unless something else reads them (ONNX Runtime warns of a constant left over).
    read = {name for node in kept for name in node.input} | {out.name for out in graph.output}
    sizes = {node.input[1] for node in graph.node if id(node) in folded and len(node.input) > 1} - read
    kept = [node for node in kept if node.op_type != "Constant" or node.output[0] not in sizes]
    unread = [t for t in graph.initializer if t.name in sizes]
    for tensor in unread:
        graph.initializer.remove(tensor)
    for value in [v for v in graph.input if v.name in sizes]:  # initializers listed as inputs (old IR)
        graph.input.remove(value)
    del graph.node[:]
    graph.node.extend(kept)
    return model


# ONNX's Attention is defined from this opset on.
ATTENTION_OPSET = 23

# Standard ops whose meaning changed between opset 17 and 23 in ways a mere version bump would break:
# GroupNormalization's scale and bias went from per-group to per-channel in 21, GridSample renamed its
# modes and DFT took its axis as an input in 20. Static int8's QDQ graphs (a DequantizeLinear in them) stay
# at the opset onnxruntime's QDQ fusions know (see above); a QuantizeLinear alone (dynamic int8's per-row
# activations, `hotrod.optimize.row_scales`) means the same at 23. A graph holding any of these keeps its
# opset, and its attention. The reductions took their axes as an input from opset 18: they are rewritten
# so (`_axes_as_inputs`), as ONNX's version converter does.
_CHANGED_BY_23 = ("GroupNormalization", "GridSample", "DFT", "DequantizeLinear")
_REDUCTIONS = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
               "ReduceProd", "ReduceSumSquare")


def onnx_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each self-attention MultiHeadAttention whose q, k and v are the equal parts of one Split of the last
    axis (q and k possibly through a rotary embedding each), with no inputs past an additive attention bias
    and no outputs past its result, becomes ONNX's
    Attention (opset 23), with the same heads, scale and bias (its float `attn_mask` is added the same way).
    The graph's opset is raised to 23 for it, or nothing changes where that is not a mere bump."""
    graph = model.graph
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or not _bumpable(model):
        return model
    producer = graphs.producers(graph)
    constants = graphs.constants(graph)
    converted = 0
    for index, node in enumerate(graph.node):
        attention = _as_onnx_attention(node, producer, constants)
        if attention is not None:
            graph.node[index].CopyFrom(attention)
            converted += 1
    if converted:
        raise_opset(model, ATTENTION_OPSET)
    return model


def raise_opset(model: onnx.ModelProto, version: int) -> bool:
    """Raise `model`'s standard opset to `version` (at most 23) where that changes the meaning of none of its
    ops, rewriting what only changed its spelling; returns whether the graph is now at `version` or above."""
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version >= version:
        return opset is not None
    if version > ATTENTION_OPSET or not _bumpable(model):
        return False
    for node in model.graph.node:  # from opset 18 a Split given no sizes must say how many parts it makes
        if node.op_type == "Split" and node.domain in ("", "ai.onnx") and (len(node.input) < 2 or not node.input[1]) \
                and not any(a.name == "num_outputs" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("num_outputs", len(node.output)))
    _axes_as_inputs(model.graph)
    opset.version = version
    return True


def _axes_as_inputs(graph: onnx.GraphProto) -> None:
    """Each reduction's `axes` attribute (opset 17 and before) as its second input (opset 18 on)."""
    for node in graph.node:
        axes = next((a for a in node.attribute if a.name == "axes"), None)
        if node.domain not in ("", "ai.onnx") or node.op_type not in _REDUCTIONS or axes is None:
            continue
        name = f"{node.output[0]}_axes"
        graph.initializer.append(numpy_helper.from_array(np.array(list(axes.ints), dtype=np.int64), name))
        node.attribute.remove(axes)
        node.input.append(name)


def _bumpable(model: onnx.ModelProto) -> bool:
    """Whether raising the graph's opset to 23 leaves the meaning of every standard op in it unchanged."""
    if model.functions:
        return False  # their bodies would need the same check; hotrod's graphs have none
    for node in model.graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return False  # a subgraph's ops would need the same check; hotrod's graphs have none
        if node.domain in ("", "ai.onnx") and node.op_type in _CHANGED_BY_23:
            return False
    return True


def _as_onnx_attention(node: onnx.NodeProto, producer: dict, constants: dict) -> onnx.NodeProto | None:
    """ONNX's Attention computing what `node` does, or None where `node` is not the plain self-attention
    `onnx_attention` converts."""
    if node.op_type != "MultiHeadAttention" or node.domain != "com.microsoft":
        return None
    inputs = list(node.input) + [""] * (6 - len(node.input))
    if not all(inputs[:3]) or inputs[3] or inputs[4] or any(inputs[6:]) or any(node.output[1:]):
        return None  # packed or biased q/k/v, a key padding mask, a KV cache in or out
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("unidirectional", 0) or set(attrs) - {"num_heads", "scale", "mask_filter_value", "unidirectional"}:
        return None
    parts = [_unrotated(name, producer) for name in inputs[:3]]
    split = producer.get(parts[0])
    if split is None or split.op_type != "Split" or list(split.output) != parts \
            or not _equal_last_axis_split(split, constants):
        return None  # cross-attention, or q / k / v of other widths
    extra = {"scale": attrs["scale"]} if attrs.get("scale") else {}  # the contrib op's 0 means 1/sqrt(head size)
    return onnx.helper.make_node(
        "Attention", [*inputs[:3], *([inputs[5]] if inputs[5] else [])], [node.output[0]], name=node.name,
        q_num_heads=attrs["num_heads"], kv_num_heads=attrs["num_heads"], **extra)


def _unrotated(name: str, producer: dict) -> str:
    """The input of the rotary embedding (`hotrod.models.rotary.RotaryEmbedding`) that makes `name`, or `name`
    itself: the op turns a [B, S, H*D] projection in place, shape and all."""
    node = producer.get(name)
    if node is not None and node.op_type == "RotaryEmbedding" and node.domain == "com.microsoft":
        return node.input[0]
    return name


def _equal_last_axis_split(split: onnx.NodeProto, constants: dict) -> bool:
    """Whether `split` cuts the last axis of a [B, S, 3*H*D] tensor into three equal parts."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in split.attribute}
    if attrs.get("axis", 0) not in (-1, 2) or len(split.output) != 3:
        return False
    sizes = graphs.split_sizes(split, constants)
    return sizes is not None and len(set(sizes)) <= 1  # no sizes given: equal parts


# Standard ops that are left where a fusion did not match: each is the telltale of a block the fused graph
# runs as separate kernels (a Tanh is not one: BERT's pooler and RoBERTa's head use it as it is).
UNFUSED_MARKERS = {"Softmax": "attention", "ReduceMean": "a layer norm", "Erf": "GELU", "Sqrt": "a norm",
                   "Pow": "a norm or GELU"}


def unfused_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many of each telltale op (`UNFUSED_MARKERS`) the graph still holds."""
    counts = Counter(node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx"))
    return {op: counts[op] for op in UNFUSED_MARKERS if counts[op]}


def fused_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts = Counter(node.op_type for node in model.graph.node)
    return {op: counts[op] for op in FUSED_OPS if counts[op]}
