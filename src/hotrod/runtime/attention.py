"""hotrod's encoder attention on AMX tiles: a graph's self-attention as hotrod's Bf16Attention, where its
build asked for it.

onnxruntime computes ONNX's Attention op on the CPU in fp32; at 384 tokens that is a third of a BERT-large
int8 encoder's time. On a CPU with AMX-BF16 (`hotrod/native/attention.c`) the two products run on the tiles
in bf16 with fp32 sums, the scale, mask and softmax in fp32. Unlike hotrod's other kernels this one changes
the answers (by bf16's rounding), so a graph takes it only where its precision wrote `ATTENTION_KEY` into
it at build time (`hotrod.precisions`): the build's verification, run through this same loader, measured
it, and the manifest says so. Elsewhere (no AMX-BF16, an older graph) onnxruntime's fp32 kernel runs it.
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto, helper

from hotrod.precisions import ATTENTION_KEY
from hotrod.runtime import native

OP = "Bf16Attention"
ARITHMETIC = "bf16"  # the attention products this kernel computes in, as a build asks for them
_NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16")
_PLAIN = {"q_num_heads", "kv_num_heads", "scale", "is_causal", "softcap", "qk_matmul_output_mode"}


def available() -> bool:
    """Whether this CPU runs the kernel: AMX-BF16 in its flags, the library built, the tile state granted."""
    return native.tiles_ready(_NEEDED_FLAGS)


def asked(model: onnx.ModelProto) -> bool:
    """Whether the graph's build asked for bf16 attention (`hotrod.precisions.ATTENTION_KEY`)."""
    return any(p.key == ATTENTION_KEY and p.value == ARITHMETIC for p in model.metadata_props)


def rewrite(model: onnx.ModelProto) -> int:
    """Every plain self-attention node of `model` as Bf16Attention, in place, where its build asked for it;
    returns how many. Plain: ONNX's Attention on [B, S, H x D] inputs with as many key as query heads, no
    cache, no causal mask, no soft cap, and a float additive mask or none."""
    if not asked(model):
        return 0
    graph = model.graph
    types = _float_values(graph)
    count = 0
    for node in graph.node:
        plain = _plain(node, types)
        if plain is not None:
            heads, scale = plain
            node.CopyFrom(helper.make_node(OP, list(node.input), [node.output[0]], name=f"{node.name}_bf16",
                                           domain=native.DOMAIN, num_heads=heads, scale=scale))
            count += 1
    if count:
        native.add_domain(model)
    return count


def _plain(node: onnx.NodeProto, floats: set[str]) -> tuple[int, float] | None:
    """(heads, scale) of a self-attention node the kernel computes (scale 0: 1 / sqrt(head size), found by
    the kernel's caller from the inputs' width); None for any other node."""
    if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.input) not in (3, 4) or not all(node.input[:3]) or len(node.output) != 1 or not node.output[0]:
        return None
    if len(node.input) == 4 and node.input[3] and node.input[3] not in floats:
        return None  # a boolean mask, or one whose type is not known here
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if set(attrs) - _PLAIN or attrs.get("is_causal", 0) or attrs.get("softcap", 0.0) \
            or attrs.get("qk_matmul_output_mode", 0):
        return None
    heads = attrs.get("q_num_heads", 0)
    if not heads or attrs.get("kv_num_heads") != heads:
        return None  # 4-D inputs, or grouped key/value heads
    scale = float(attrs.get("scale", 0.0))
    if scale and not math.isfinite(scale):
        return None
    return heads, scale


def _float_values(graph: onnx.GraphProto) -> set[str]:
    """Names known to hold float tensors without inferring shapes: typed graph values, float initializers,
    and the outputs of Where nodes that choose between float constants (hotrod's exports' additive masks)."""
    floats = {v.name for v in (*graph.input, *graph.value_info, *graph.output)
              if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    floats |= {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    floats |= {n.output[0] for n in graph.node if n.op_type in ("Constant", "ConstantOfShape")
               and n.attribute and n.attribute[0].t.data_type == TensorProto.FLOAT}
    return floats | {n.output[0] for n in graph.node
                     if n.op_type == "Where" and n.input[1] in floats and n.input[2] in floats}
