"""hotrod's int8 products on AMX tiles (on AVX-512 VNNI without them): a dynamic int8 graph's products as
hotrod's Int8MatMul.

hotrod's dynamic int8 graphs (`hotrod.optimize.row_scales`) spell each product as

    MatMulInteger(q, W, 128, 0) -> Cast(float) -> Mul(Mul(row scales, column scales)) [-> Sub(-bias) | Add(bias)]
        [-> Gelu] [-> Add(residual)]

which onnxruntime fuses into MatMulIntegerToFloat, an AVX-512 VNNI kernel at best. On a CPU with AMX
(`hotrod/native/i8gemm.c`) a core multiplies int8 several times faster on its tiles, so as a graph is loaded
there each such chain becomes one Int8MatMul: the same quantized rows and row scales in, the weights packed
once into the tiles' layout, the exact int32 sums scaled as onnxruntime scales them, the bias added, a
following GELU applied (with onnxruntime's own arithmetic: the same answers, without the Gelu node's pass over
the feed-forward layer's widest activations) and a following residual added, all in the same pass. On a CPU
without AMX (a Zen 4, or where Linux refuses the tile state) but with AVX-512 VNNI the same op reads the same
packed weights with VPDPBUSD, 8 rows at a time: the same exact sums, and the fusions, against onnxruntime's
kernel plus its separate passes (benchmarks/README.md: "Without AMX"); `hotrod tune` leaves it out on a CPU
where onnxruntime's is faster. Elsewhere onnxruntime's kernel runs the graph as it is. The op runs on
onnxruntime's own threads, so a graph keeps its session's thread count.

Calibrated graphs (int8-static: onnxruntime's static quantization, QDQ) spell a product as

    MatMul(DequantizeLinear(q, s, z), DequantizeLinear(W, column scales, 0)) [-> Add(bias)] [-> Gelu] [-> Add]

with q = QuantizeLinear(x, s, z), one scale s and zero point z for every row; onnxruntime runs it as
MatMulIntegerToFloat, the exact sums times (s * column scale), the bias added after. The same Int8MatMul
computes that with one row scale of 1 (exact) and column scales s * column scale, z taken back per column as
the dynamic graphs' 128 is; the QuantizeLinear stays onnxruntime's node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.optimize import graphs
from hotrod.optimize.row_scales import SHARED, ZERO_POINT
from hotrod.runtime import chains, native, rows

OP = "Int8MatMul"
SPLIT_OP = "Int8MatMulSplit"  # the same, its columns in three equal outputs (a fused Q/K/V product's)
ROWS_OP = "Int8MatMulRows"  # the same, its output quantized per row for the next product (QuantizeRows's outputs)
QUANTIZED_OP = "Int8MatMulQuantized"  # the same, its output quantized as a calibrated QuantizeLinear that read it
# The most packed weight bytes a product may have for its output to be quantized in the op: each unit of work
# then makes 32 whole rows and streams all the weights through its core, which pays where they stay in the
# core's L2 cache (2 MiB on the CPUs with AMX, beside the rows) and loses where they come from the shared L3.
ROWS_WEIGHT_BYTES = 1 << 20
DEPTH = 64  # the kernel's depth step: K must be a multiple
COLS = 32  # the kernel's columns a step: weights are padded to a multiple
GELU = 1  # the op's `activation` for a GELU after the bias (HOTROD_I8_GELU)
_NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "amx_tile", "amx_int8")
_VECTOR_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")  # the path without tiles


def available() -> bool:
    """Whether this CPU runs the kernel: on AMX-INT8's tiles (in its flags, the library built, the tile state
    granted) or, without them, on AVX-512 VNNI (a Zen 4's path: the same packed weights, 8 rows a step)."""
    return native.tiles_ready(_NEEDED_FLAGS) or native.vectors_ready(_VECTOR_FLAGS, "hotrod_vnni_ready")


def on_tiles() -> bool:
    """Whether graphs loaded now run the kernel on AMX's tiles, rather than on its AVX-512 path: each op is
    told which as its graph is rewritten (its `tiles` attribute) and keeps it for the session."""
    return native.tiles_ready(_NEEDED_FLAGS)


def pack(weights: np.ndarray, scales: np.ndarray, bias: np.ndarray | None, zero_point: int = ZERO_POINT,
         row_scale: np.float32 | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int8 weights [K, N] (K a multiple of DEPTH) in the kernel's layout, [N' / 32, K / 64, 2048] where
    byte 64 r + 4 c + j of a [16, 64] tile holds W[64 d + 4 r + j, 32 b + 16 h + c] (N' = N padded with
    zero columns to COLS); with `zero_point` (the uint8 rows', 128 in the dynamic graphs) * each column's sum,
    taken back per column, and the column scales (times `row_scale` in float32, where one scale serves every
    row) and bias (zeros where there is none) padded alike."""
    k, n = weights.shape
    padded_n = -(-n // COLS) * COLS
    padded = np.zeros((k, padded_n), dtype=np.int8)
    padded[:, :n] = weights
    tiles = padded.reshape(k // DEPTH, 16, 4, padded_n // COLS, 2, 16)  # [d, r, j, b, h, c]
    packed = np.ascontiguousarray(tiles.transpose(3, 0, 4, 1, 5, 2)).reshape(padded_n // COLS, k // DEPTH, 2048)
    offsets = np.zeros(padded_n, dtype=np.int32)
    offsets[:n] = int(zero_point) * weights.astype(np.int32).sum(axis=0)
    column_scales = np.zeros(padded_n, dtype=np.float32)
    column_scales[:n] = np.broadcast_to(scales.astype(np.float32).reshape(-1), (n,))
    if row_scale is not None:  # onnxruntime's multiplier: the two scales' product, one float32 rounding
        column_scales[:n] = np.float32(row_scale) * column_scales[:n]
    padded_bias = np.zeros(padded_n, dtype=np.float32)
    if bias is not None:
        padded_bias[:n] = np.broadcast_to(bias.astype(np.float32).reshape(-1), (n,))
    return packed, offsets, column_scales, padded_bias


def rewrite(model: onnx.ModelProto) -> int:
    """Every int8 product chain of `model` (per-row or calibrated) that the kernel computes as Int8MatMul (or,
    with the Split of a fused Q/K/V product, Int8MatMulSplit), in place; returns how many. Weights two products
    share are packed once."""
    return chains.rewrite(model, _KERNEL)


@dataclass(kw_only=True)
class _Chain(chains.Chain):
    # the product's nodes start with MatMulInteger, Cast, the scales' Mul and the scaling Mul (a dynamic graph's)
    # or the MatMul (a calibrated graph's)
    rows: str  # the quantized rows
    row_scales: str  # their scales; a calibrated graph's: "" until the rewrite names its unit scale
    column_scales: str
    zero_point: str | None = None  # a calibrated graph's rows' zero point (the dynamic graphs': 128)
    row_scale: str | None = None  # a calibrated graph's one scale for every row, taken into the column scales
    # `feeding`: a calibrated graph's DequantizeLinear nodes before the MatMul


def _arrays(chain: _Chain, constants: dict) -> tuple[np.ndarray, ...]:
    zero_point = _scalar(constants, chain.zero_point) if chain.zero_point else ZERO_POINT
    row_scale = np.float32(_scalar(constants, chain.row_scale)) if chain.row_scale else None
    return pack(numpy_helper.to_array(constants[chain.weights]), numpy_helper.to_array(constants[chain.column_scales]),
                chains.bias(chain, constants), zero_point, row_scale)


def _scalar(constants: dict, name: str) -> np.generic:
    """A one-element constant's value ([] or [1])."""
    return numpy_helper.to_array(constants[name]).reshape(-1)[0]


def _op(chain: _Chain, packed: list[str]) -> onnx.NodeProto:
    op, outputs = (SPLIT_OP, list(chain.split.output)) if chain.split else (OP, [chain.nodes[-1].output[0]])
    extra = {"activation": GELU} if chain.gelu else {}
    residual = [chain.residual] if chain.residual else []
    return helper.make_node(op, [chain.rows, chain.row_scales, *packed, *residual], outputs,
                            name=f"{chain.nodes[0].name or chain.weights}_i8", domain=native.DOMAIN, N=chain.n,
                            tiles=int(on_tiles()), **extra)


def _unit_scale(chain: _Chain, taken: set[str], added: list[onnx.TensorProto]) -> None:
    """A calibrated graph's row scale: 1 (one initializer for every product), its own scale taken into the column
    scales."""
    if chain.row_scale is None:
        return
    unit = next((init.name for init in added if init.name.startswith(_UNIT)), None)
    if unit is None:
        unit = graphs.unused_name(_UNIT, taken)
        added.append(numpy_helper.from_array(np.ones(1, np.float32), unit))
    chain.row_scales = unit


def _start(node: onnx.NodeProto, constants: dict, consumers: dict, producers: dict) -> _Chain | None:
    """The product at `node`: a dynamic graph's MatMulInteger or a calibrated graph's MatMul."""
    return _dynamic(node, constants, consumers, producers) or _calibrated(node, constants, consumers, producers)


def _dynamic(node: onnx.NodeProto, constants: dict, consumers: dict, producers: dict) -> _Chain | None:
    """A dynamic graph's product (`row_scales`) up to its scaling Mul, where `node` is its MatMulInteger."""
    if node.op_type != "MatMulInteger" or node.domain not in ("", "ai.onnx") or len(node.input) != 4:
        return None
    rows, weights, zero_point, weight_zero_points = node.input
    if zero_point != f"{SHARED}_zero_point" or weight_zero_points not in constants:
        return None
    w = _weights(weights, constants)
    if w is None or np.any(numpy_helper.to_array(constants[weight_zero_points])):
        return None
    cast = chains.only(consumers, node.output[0], "Cast")
    if cast is None or helper.get_attribute_value(cast.attribute[0]) != TensorProto.FLOAT:
        return None
    scaled = chains.only(consumers, cast.output[0], "Mul")
    if scaled is None:
        return None
    scales = producers.get(next(name for name in scaled.input if name != cast.output[0]))
    if scales is None or scales.op_type != "Mul" or len(consumers.get(scales.output[0], [])) != 1:
        return None
    column = [name for name in scales.input if name in constants]
    row_scales = [name for name in scales.input if name not in constants]
    n = int(w.dims[1])
    if len(column) != 1 or len(row_scales) != 1 or not chains.per_column(constants[column[0]], n):
        return None
    return _Chain(nodes=[node, cast, scales, scaled], rows=rows, row_scales=row_scales[0], weights=weights,
                  column_scales=column[0], n=n)


def _calibrated(node: onnx.NodeProto, constants: dict, consumers: dict, producers: dict) -> _Chain | None:
    """A calibrated graph's product, where `node` is a MatMul of its dequantized rows (uint8, one constant scale
    and zero point) by its dequantized weights (constant int8 [K, N], a scale per column or one, zero points 0).
    None where its one reader quantizes it again: onnxruntime runs that as QLinearMatMul, one rounding fewer."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    rows, weights = (producers.get(name) for name in node.input)
    if not (_dequantizes(rows, constants) and _dequantizes(weights, constants)) or len(rows.input) != 3:
        return None
    q, scale, zero_point = rows.input
    if constants[zero_point].data_type != TensorProto.UINT8 or _size(constants[scale]) != 1 \
            or _size(constants[zero_point]) != 1 or chains.only(consumers, node.output[0], "QuantizeLinear") is not None:
        return None
    w = _weights(weights.input[0], constants)
    if w is None:
        return None
    n = int(w.dims[1])
    attrs = {a.name: helper.get_attribute_value(a) for a in weights.attribute}
    column = weights.input[1]
    if not chains.per_column(constants[column], n) or (list(constants[column].dims) == [n] and n > 1
                                                  and attrs.get("axis", 1) not in (1, -1)):
        return None
    if len(weights.input) == 3 and np.any(numpy_helper.to_array(constants[weights.input[2]])):
        return None
    return _Chain(nodes=[node], rows=q, row_scales="", weights=weights.input[0], column_scales=column, n=n,
                  zero_point=zero_point, row_scale=scale, feeding=(rows, weights))


_UNIT = "hotrod_i8_unit_scale"
_KERNEL = chains.Kernel(start=_start, key=lambda c: (c.column_scales, c.zero_point, c.row_scale), arrays=_arrays,
                        stems=("i8", "offsets", "scales", "bias"), op=_op, prepare=_unit_scale)


def _size(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims))


def _dequantizes(node: onnx.NodeProto | None, constants: dict) -> bool:
    """Whether `node` is a DequantizeLinear whose scale and zero point are constants."""
    return node is not None and node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx") \
        and len(node.input) in (2, 3) and all(name in constants for name in node.input[1:])


def _weights(name: str, constants: dict) -> onnx.TensorProto | None:
    """The constant int8 weights [K, N] the kernel packs (K a multiple of DEPTH), or None."""
    w = constants.get(name)
    return w if w is not None and w.data_type == TensorProto.INT8 and len(w.dims) == 2 and not w.dims[0] % DEPTH \
        else None


def quantize_outputs(model: onnx.ModelProto) -> int:
    """Every Int8MatMul of `model` (rewritten already, without a residual) whose one reader is the next
    product's per-row quantization (QuantizeRows: `hotrod.runtime.rows`), and whose weights are at most
    ROWS_WEIGHT_BYTES, as one Int8MatMulRows with that quantization's outputs, in place; returns how many. The
    output is quantized as QuantizeRows quantizes it (the same kernel), so the answers stay the same."""
    sizes = {init.name: int(np.prod(init.dims)) for init in model.graph.initializer}

    def reader(node: onnx.NodeProto, readers: dict, constants: dict) -> onnx.NodeProto | None:
        following = chains.only(readers, node.output[0], rows.OP)
        small = sizes.get(node.input[2], ROWS_WEIGHT_BYTES + 1) <= ROWS_WEIGHT_BYTES
        return following if small and following is not None and following.domain == native.DOMAIN else None

    return _take_reader(model, ROWS_OP, reader)


def quantize_static(model: onnx.ModelProto) -> int:
    """Every Int8MatMul of `model` (rewritten, no residual) whose one reader is a QuantizeLinear to uint8 with one
    constant scale and zero point (int8-static's input to the next product) as one Int8MatMulQuantized with its
    output, in place; returns how many. The epilogue quantizes as that node did, to the bit: the floats are
    neither written nor read again."""
    return _take_reader(model, QUANTIZED_OP,
                        lambda node, readers, constants: static_reader(readers, node.output[0], constants))


def _take_reader(model: onnx.ModelProto, op: str, reader) -> int:
    """Every Int8MatMul without a residual, not a graph output, whose `reader(node, readers, constants)` names a
    node, as one `op` taking that node's inputs past its first and giving its outputs, in place; how many."""
    graph = model.graph
    constants = graphs.fixed_initializers(graph)
    readers = graphs.readers(graph)
    outputs = {value.name for value in graph.output}
    fused, dropped = 0, set()
    for node in graph.node:
        if node.op_type != OP or node.domain != native.DOMAIN or len(node.input) != 6 or node.output[0] in outputs:
            continue
        if (following := reader(node, readers, constants)) is None:
            continue
        node.op_type = op
        node.input.extend(following.input[1:])
        del node.output[:]
        node.output.extend(following.output)
        dropped.add(id(following))
        fused += 1
    graphs.drop_nodes(graph, dropped)
    return fused


def static_reader(readers: dict, name: str, constants: dict) -> onnx.NodeProto | None:
    """The one node reading `name` where it is a QuantizeLinear that `quantizes_static`; else None."""
    following = chains.only(readers, name, "QuantizeLinear")
    return following if following is not None and following.domain in ("", "ai.onnx") \
        and quantizes_static(following, constants) else None


def quantizes_static(node: onnx.NodeProto, constants: dict) -> bool:
    """Whether a QuantizeLinear quantizes to uint8 with one constant float scale and uint8 zero point."""
    if len(node.input) != 3 or node.input[1] not in constants or node.input[2] not in constants:
        return False
    scale, zero_point = constants[node.input[1]], constants[node.input[2]]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (scale.data_type == TensorProto.FLOAT and _size(scale) == 1 and zero_point.data_type == TensorProto.UINT8
            and _size(zero_point) == 1 and not attrs.get("block_size", 0)
            and attrs.get("output_dtype", TensorProto.UINT8) in (0, TensorProto.UINT8))


