"""hotrod's bf16 products on AMX tiles (on AVX-512 BF16 without them): an fp32 graph's products as hotrod's
Bf16MatMul, where its build asked for them.

8-bit activations cost a trained model some of its answers (benchmarks/README.md: a MiniLM question-answering
head keeps 0.96 of fp32's answer F1 at int8, 0.92 at int8-static), where products with both operands rounded to
bf16 (8 significant bits, an exponent of their own per value) and fp32 sums keep them (0.9998). On a CPU with
AMX-BF16 (`hotrod/native/bf16gemm.c`) a core's tiles multiply bf16 several times faster than its fp32 units, so
a graph built at bf16-products keeps its fp32 weights and, as it is loaded there, each product

    MatMul(x, W) [-> Add(bias)] [-> Gelu] [-> Add(residual)]   (or, for a fused Q/K/V product, -> Split)

becomes one Bf16MatMul: the weights rounded and packed once into the tiles' layout, the rows rounded as they
are read, the bias, GELU and residual in the same pass. Like bf16 attention this changes the answers (by bf16's
rounding), so a graph takes it only where its precision wrote `PRODUCTS_KEY` into it (`hotrod.precisions`): the
build's verification, run through this same loader, measured it. On a CPU with AVX-512 BF16 but no AMX (a Zen 4)
the same op reads the same packed weights with VDPBF16PS, 8 rows at a time (`hotrod tune` leaves it out where
onnxruntime's fp32 product is faster: on the Xeon the project measures on, VDPBF16PS multiplies at half the
rate of fp32's FMA, 57 against 111 G multiply-adds a second a core).
Elsewhere (neither, or a graph that did not ask) onnxruntime runs the fp32 graph as it is.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.asks import PRODUCTS_KEY
from hotrod.optimize import graphs
from hotrod.runtime import chains, native

OP = "Bf16MatMul"
SPLIT_OP = "Bf16MatMulSplit"  # the same, its columns in three equal outputs (a fused Q/K/V product's)
ROUNDED_OP = "Bf16MatMulRounded"  # the same, its output rounded to bf16 for the one product that reads it
OPS = (OP, SPLIT_OP, ROUNDED_OP)
ARITHMETIC = "bf16"  # the products this kernel computes in, as a build asks for them
DEPTH = 32  # the kernel's depth step: weights (and rows, as they are read) are padded with zeros to a multiple
COLS = 32  # the kernel's columns a step: weights are padded to a multiple
GELU = 1  # the op's `activation` for a GELU after the bias (as Int8MatMul's)
_NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16")
_VECTOR_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")  # the path without tiles


def available() -> bool:
    """Whether this CPU runs the kernel: on AMX-BF16's tiles (in its flags, the library built, the tile state
    granted) or, without them, on AVX-512 BF16 (a Zen 4's path: the same packed weights, 8 rows a step)."""
    return native.tiles_ready(_NEEDED_FLAGS) or native.vectors_ready(_VECTOR_FLAGS, "hotrod_bf16_vectors_ready")


def asked(model: onnx.ModelProto) -> bool:
    """Whether the graph's build asked for bf16 products (`hotrod.asks.PRODUCTS_KEY`)."""
    return any(p.key == PRODUCTS_KEY and p.value == ARITHMETIC for p in model.metadata_props)


def on_tiles() -> bool:
    """Whether graphs loaded now run the kernel on AMX's tiles, rather than on its AVX-512 path: each op is
    told which as its graph is rewritten (its `tiles` attribute) and keeps it for the session."""
    return native.tiles_ready(_NEEDED_FLAGS)


def pack(weights: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """fp32 weights [K, N] rounded to bf16 (to nearest even) in the kernel's layout, [N' / 32, K' / 32, 1024]
    where value 512 h + 32 r + 2 c + j of a step holds W[32 d + 2 r + j, 32 b + 16 h + c] (K' and N' padded with
    zeros to multiples of DEPTH and COLS); and the bias (zeros where there is none) padded to N'."""
    k, n = weights.shape
    padded_k, padded_n = -(-k // DEPTH) * DEPTH, -(-n // COLS) * COLS
    padded = np.zeros((padded_k, padded_n), dtype=ml_dtypes.bfloat16)
    padded[:k, :n] = weights.astype(np.float32).astype(ml_dtypes.bfloat16)
    tiles = padded.reshape(padded_k // DEPTH, 16, 2, padded_n // COLS, 2, 16)  # [d, r, j, b, h, c]
    packed = np.ascontiguousarray(tiles.transpose(3, 0, 4, 1, 5, 2)).reshape(padded_n // COLS, padded_k // DEPTH,
                                                                              DEPTH * COLS)
    padded_bias = np.zeros(padded_n, dtype=np.float32)
    if bias is not None:
        padded_bias[:n] = np.broadcast_to(bias.astype(np.float32).reshape(-1), (n,))
    return packed, padded_bias


def rewrite(model: onnx.ModelProto) -> int:
    """Every fp32 product of `model` by constant weights (with what follows it: `hotrod.runtime.chains`) as
    Bf16MatMul (or, with the Split of a fused Q/K/V product, Bf16MatMulSplit), in place, where its build asked
    for bf16 products; returns how many. Weights two products share are packed once."""
    return chains.rewrite(model, _KERNEL) if asked(model) else 0


def round_outputs(model: onnx.ModelProto) -> int:
    """Every Bf16MatMul of `model` (rewritten already, no residual, N a multiple of DEPTH, not a graph output)
    whose one reader is another bf16 product reading it as its rows (a feed-forward block's first product, read by
    its second) as one Bf16MatMulRounded, in place; returns how many. It rounds its output to bf16 as the reader
    would round it, to the bit, and the reader takes the rounded rows as they are: the floats are neither written
    nor read again."""
    graph = model.graph
    readers = graphs.readers(graph)
    outputs = {value.name for value in graph.output}
    rounded = 0
    for node in graph.node:
        if node.op_type != OP or node.domain != native.DOMAIN or len(node.input) != 3 or node.output[0] in outputs:
            continue
        n = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "N")
        following = chains.only(readers, node.output[0], None)
        if n % DEPTH or following is None or following.domain != native.DOMAIN or following.op_type not in OPS \
                or list(following.input).count(node.output[0]) != 1 or following.input[0] != node.output[0]:
            continue
        node.op_type = ROUNDED_OP
        rounded += 1
        kept = [info for info in graph.value_info if info.name != node.output[0]]  # a float type said of it goes
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return rounded


def _start(node: onnx.NodeProto, constants: dict, consumers: dict, producers: dict) -> chains.Chain | None:
    """The product at `node`: an fp32 MatMul of a computed tensor by constant fp32 weights [K, N]; else None."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    rows, weights = node.input
    w = constants.get(weights)
    if rows in constants or w is None or w.data_type != TensorProto.FLOAT or len(w.dims) != 2 or 0 in w.dims:
        return None
    return chains.Chain(nodes=[node], weights=weights, n=int(w.dims[1]))


def _arrays(chain: chains.Chain, constants: dict) -> tuple[np.ndarray, ...]:
    return pack(numpy_helper.to_array(constants[chain.weights]), chains.bias(chain, constants))


def _op(chain: chains.Chain, packed: list[str]) -> onnx.NodeProto:
    op, outputs = (SPLIT_OP, list(chain.split.output)) if chain.split else (OP, [chain.nodes[-1].output[0]])
    extra = {"activation": GELU} if chain.gelu else {}
    residual = [chain.residual] if chain.residual else []
    return helper.make_node(op, [chain.nodes[0].input[0], *packed, *residual], outputs,
                            name=f"{chain.nodes[0].name or chain.weights}_bf16", domain=native.DOMAIN, N=chain.n,
                            tiles=int(on_tiles()), **extra)


_KERNEL = chains.Kernel(start=_start, key=lambda chain: (), arrays=_arrays, stems=("bf16", "bias"), op=_op)
