"""hotrod's encoder attention in bf16: a graph's self-attention as hotrod's Bf16Attention, where its build
asked for it.

onnxruntime computes ONNX's Attention op on the CPU in fp32; at 384 tokens that is a third of a BERT-large
int8 encoder's time. On a CPU with AMX-BF16 (`hotrod/native/attention.c`) the two products run on the tiles
in bf16 with fp32 sums, the scale, mask and softmax in fp32; on one without them but with AVX512_BF16 (a Zen
4 or 5, a Cooper Lake) the same bf16 operands go through VDPBF16PS, two products a lane an instruction; with
AVX-512 alone (an Ice Lake) they are multiplied as floats, fused with the same softmax
(`hotrod/native/attention_vectors.c`). Unlike hotrod's other kernels this one changes the answers (by bf16's
rounding), so a graph takes it only where its precision wrote `ATTENTION_KEY` into it at build time
(`hotrod.precisions`): the build's verification, run through this same loader, measured it, and the manifest
says so. Elsewhere (no AVX-512, an older graph) onnxruntime's fp32 kernel runs it.

A build may ask for int8 attention instead (`int8-full`, OpenVINO's full int8 arithmetic): on a CPU with AVX-512
VNNI both products take int8 operands (`hotrod/native/attention_quads.c`: each row of Q, K and V with its own
scale, the softmax's numerators uint8), twice the products a VNNI instruction of VDPBF16PS's; without VNNI the
op takes bf16's path, closer to fp32 than what the build measured.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import onnx
from onnx import TensorProto, helper

from hotrod.asks import ATTENTION_KEY
from hotrod.optimize import graphs
from hotrod.runtime import bf16, i8, native

OP = "Bf16Attention"
QUANTIZED_OP = "Bf16AttentionQuantized"  # its output quantized for the next product, as an int8-static graph asks
_VECTOR_FLAGS = ("avx512f", "avx512bw", "avx512vl")  # the path without tiles
_PAIR_FLAGS = (*_VECTOR_FLAGS, "avx512_bf16")  # its products on bf16 pairs
_QUAD_FLAGS = (*_VECTOR_FLAGS, "avx512_vnni")  # its int8 products
TILES, PAIRS, FMAS, QUADS = 1, 2, 0, 3  # the paths, as the op's `tiles` names them
PAIRS_PATH = f"{OP}/VDPBF16PS"  # not an op: the path's name among a graph's kernels, for the tune and the bench
QUADS_PATH = f"{OP}/VPDPBUSD"  # the int8 path's likewise
PATHS = {PAIRS: PAIRS_PATH, QUADS: QUADS_PATH}  # by the op's `tiles`
_PLAIN = {"q_num_heads", "kv_num_heads", "scale", "is_causal", "softcap", "qk_matmul_output_mode"}
_MULTI_HEAD = {"num_heads", "scale", "unidirectional", "mask_filter_value"}


def available() -> bool:
    """Whether this CPU runs the kernel: on AMX-BF16's tiles (in its flags, the library built, the tile state
    granted) or, without them, on AVX-512."""
    return on_tiles() or native.vectors_ready(_VECTOR_FLAGS, "hotrod_attention_vectors_ready")


def on_tiles() -> bool:
    """Whether graphs loaded now run the kernel on AMX's tiles, rather than on its AVX-512 path: where the bf16
    products take them (AMX-BF16's, `hotrod.runtime.bf16.on_tiles`). Each op is told which as its graph is
    rewritten (its `tiles` attribute) and keeps it for the session."""
    return bf16.on_tiles()


def path(arithmetic: str = "bf16") -> int:
    """The path graphs rewritten now take for attention in `arithmetic` (one of ARITHMETICS), which each op keeps for
    its session (its `tiles`; the paths sum in different orders)."""
    return _CHOOSERS[arithmetic]()


def _bf16_path() -> int:
    """bf16's: AMX's tiles where the bf16 products take them (`TILES`); without, the same bf16 operands on
    AVX512_BF16's VDPBF16PS where this CPU has it (`PAIRS`: two products a lane an instruction), unless
    `pairs_left_out` says otherwise; else values rounded to bf16 and multiplied as floats on AVX-512F's FMAs
    (`FMAS`)."""
    if on_tiles():
        return TILES
    if not _pairs_out and native.vectors_ready(_PAIR_FLAGS, "hotrod_attention_pairs_ready"):
        return PAIRS
    return FMAS


def _int8_path() -> int:
    """int8's: int8 operands on AVX-512 VNNI where this CPU has it (`QUADS`), else bf16's."""
    return QUADS if quads_ready() else _bf16_path()


# Each arithmetic the kernel computes attention's products in, as a build asks for them, and how its path is chosen.
_CHOOSERS = {"bf16": _bf16_path, "int8": _int8_path}
ARITHMETICS = tuple(_CHOOSERS)


def quads_ready() -> bool:
    """Whether this CPU runs the int8 path: AVX-512 VNNI, and the library built with it."""
    return native.vectors_ready(_QUAD_FLAGS, "hotrod_attention_quads_ready")


_pairs_out: list[bool] = []


@contextlib.contextmanager
def pairs_left_out() -> Iterator[None]:
    """Graphs rewritten within take the path on FMAs where they would take VDPBF16PS's (sessions loaded before
    keep theirs): for testing and measuring that path on a CPU with AVX512_BF16."""
    _pairs_out.append(True)
    try:
        yield
    finally:
        _pairs_out.pop()


def asked(model: onnx.ModelProto) -> str | None:
    """The attention arithmetic the graph's build asked for (`hotrod.asks.ATTENTION_KEY`): bf16 or int8, or None."""
    return next((p.value for p in model.metadata_props if p.key == ATTENTION_KEY and p.value in ARITHMETICS), None)


def rewrite(model: onnx.ModelProto) -> int:
    """Every plain self-attention node of `model` as Bf16Attention, in place, where its build asked for it;
    returns how many. Plain: ONNX's Attention on [B, S, H x D] inputs with as many key as query heads, or
    com.microsoft's MultiHeadAttention (T5's encoders, their position bias the additive mask) on a [B, S, H x D]
    query and keys and values [B, H, S, D] transposed from [B, S, H, D] (which the op reads as they were before
    the Transpose), or keys and values [B, S, H x D] split with the query from one fused product (an int8-static
    encoder's); no cache, no causal mask, no soft cap, and a float additive mask or none."""
    arithmetic = asked(model)
    if arithmetic is None:
        return 0
    graph = model.graph
    types = _float_values(graph)
    producers = graphs.producers(graph)
    constants = graphs.constants(graph)
    count, detached = 0, set()  # the Transposes whose outputs the ops no longer read
    tiles = path(arithmetic)  # the path each op keeps for its session
    for node in graph.node:
        plain = _plain(node, types) or _multi_head(node, types, producers, constants)
        if plain is not None:
            inputs, heads, scale = plain
            detached |= {id(producers[name]) for name in set(node.input) - set(inputs) if name in producers}
            node.CopyFrom(helper.make_node(OP, inputs, [node.output[0]], name=f"{node.name}_bf16",
                                           domain=native.DOMAIN, num_heads=heads, scale=scale, tiles=tiles))
            count += 1
    if count:
        read = graphs.read_names(graph)
        kept = [node for node in graph.node if id(node) not in detached or node.output[0] in read]
        del graph.node[:]
        graph.node.extend(kept)
        native.add_domain(model)
    return count


def quantize_static(model: onnx.ModelProto) -> int:
    """Every Bf16Attention of `model` (rewritten already) whose one reader is a QuantizeLinear to uint8 with one
    constant scale and zero point (int8-static's input to the output projection) as one Bf16AttentionQuantized
    giving that node's output, in place; returns how many. The kernel quantizes each answer as that node did, to
    the bit, from the same floats, which are neither written nor read again."""
    graph = model.graph
    constants = graphs.fixed_initializers(graph)
    readers = graphs.readers(graph)
    outputs = {value.name for value in graph.output}
    dropped = set()
    for node in graph.node:
        if node.op_type != OP or node.domain != native.DOMAIN or node.output[0] in outputs:
            continue
        if (following := i8.static_reader(readers, node.output[0], constants)) is None:
            continue
        inputs = list(node.input) + [""] * (4 - len(node.input))  # no mask: its place left empty
        node.op_type = QUANTIZED_OP
        del node.input[:]
        node.input.extend(inputs + list(following.input[1:]))
        node.output[0] = following.output[0]
        dropped.add(id(following))
    graphs.drop_nodes(graph, dropped)
    return len(dropped)


def _plain(node: onnx.NodeProto, floats: set[str]) -> tuple[list[str], int, float] | None:
    """(inputs, heads, scale) of an ONNX Attention node the kernel computes (scale 0: 1 / sqrt(head size),
    found by the kernel's caller from the inputs' width); None for any other node."""
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
    return list(node.input), heads, scale


def _multi_head(node: onnx.NodeProto, floats: set[str], producers: dict,
                constants: dict) -> tuple[list[str], int, float] | None:
    """(inputs, heads, scale) of a com.microsoft MultiHeadAttention node the kernel computes: query, key and
    value, no bias, key padding mask or cache, an additive float attention bias or none, one output."""
    if node.op_type != "MultiHeadAttention" or node.domain != "com.microsoft" or len(node.output) != 1:
        return None
    inputs = list(node.input) + [""] * (6 - len(node.input))
    if not all(inputs[:3]) or any(inputs[3:5]) or any(inputs[6:]) or (inputs[5] and inputs[5] not in floats):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if set(attrs) - _MULTI_HEAD or attrs.get("unidirectional", 0) or not attrs.get("num_heads"):
        return None
    scale = float(attrs.get("scale", 0.0))
    if _split_together(inputs[:3], producers, constants):
        key, value = inputs[1:3]
    else:
        key, value = (_before_transpose(name, producers) for name in inputs[1:3])
    if key is None or value is None or (scale and not math.isfinite(scale)):
        return None  # keys or values whose layout is not known here without shapes (a decoder's cache: [B, H, S, D])
    return [inputs[0], key, value] + ([inputs[5]] if inputs[5] else []), attrs["num_heads"], scale


def _split_together(names: list[str], producers: dict, constants: dict) -> bool:
    """Whether query, key and value are, in order, the three outputs of one Split of the last axis (a fused
    Q/K/V product's, as onnxruntime's fusion leaves an int8-static encoder): the query is [B, S, H x D], so
    the key and value split from the same tensor are too. Equal parts only."""
    node = producers.get(names[0])
    if node is None or list(node.output) != names:
        return False
    if node.op_type in (i8.SPLIT_OP, bf16.SPLIT_OP) and node.domain == native.DOMAIN:
        return True  # the Split taken into hotrod's int8 or bf16 product: three equal parts of the last axis
    if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
        return False
    if next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0) != -1:
        return False
    # the kernel reads keys and values as wide as the query: sizes given and equal (none given leaves the last
    # part narrower where the width does not divide)
    sizes = graphs.split_sizes(node, constants)
    return sizes is not None and len(sizes) == 3 and len(set(sizes)) == 1


def _before_transpose(name: str, producers: dict) -> str | None:
    """The [B, S, H, D] tensor a [B, H, S, D] key or value was transposed from; None where it was not."""
    node = producers.get(name)
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    perm = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "perm"), None)
    return node.input[0] if perm is not None and list(perm) == [0, 2, 1, 3] else None


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
