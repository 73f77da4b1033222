"""hotrod's int4 kernel on the CPU: onnxruntime's int4 products (MatMulNBits) as hotrod's Q4MatMul.

On a Xeon with AVX-512 VNNI, MatMulNBits' CPU kernel is compute bound on one row, short of the memory's
bandwidth, where a decoding step is one row per sequence; hotrod's kernel (`hotrod/native/q4gemm.c`) streams
the weights faster there. On AMD's Zen 4 it wins too (W1 and W2 1.2x in `hotrod tune`), but which is faster
turns on the CPU and the shapes, so `hotrod tune` keeps whichever wins on the machine it runs on. The kernel
is built for AVX-512 VNNI and for AVX2 (CPUs without AVX-512, such as AMD's Zen 3): a graph takes the widest
build this CPU runs, with the same answers from either. The kernel
computes what MatMulNBits' int8 compute (accuracy level 4) computes: activations quantized to int8 per row and block,
int32 dot products with the 4-bit weights, one fp32 scale a block. So an artifact stays portable (its
graphs keep MatMulNBits) and is rewritten as it is loaded, where this CPU and the built library allow;
elsewhere onnxruntime's kernel runs it.

The kernel shares its columns among onnxruntime's own intra-op threads, as hotrod's other ops do, so the
rest of the graph keeps every thread and no thread of the kernel's spins against onnxruntime's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from hotrod.optimize import graphs
from hotrod.runtime import native

DOMAIN = native.DOMAIN
OP = "Q4MatMul"
GROUP_COLS = 64  # the kernel's columns a step: weights are padded to a multiple of this
# The kernel's builds, widest first, by the vector width each names in the op (its `width` attribute), and the
# flags a CPU needs for each; the library itself loads only where AVX2 and FMA are.
BUILDS = {512: ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"), 256: ("avx2", "fma")}


def widths() -> list[int]:
    """The builds of the kernel this CPU runs, widest first."""
    return [width for width, flags in BUILDS.items() if native.has_flags(flags)]


def library() -> Path | None:
    """The kernels' library, where this CPU can run the int4 kernel; None elsewhere (onnxruntime's own
    kernel runs)."""
    return native.library() if widths() else None


def pack(weights: np.ndarray, scales: np.ndarray, n: int, blocks: int, block: int,
         bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits' weights ([n, blocks, block / 2] bytes, k = 2i in byte i's low nibble) and scales
    ([n * blocks]) in the kernel's layout: [n' / 64, k' / 8, 256] bytes, four 64-byte lines of 16 columns
    each for every 8 of k, where column j of 16 holds, in byte b of its dword, k + b low and k + 4 + b high;
    scales [blocks, n'] (n' = n padded with zero columns to GROUP_COLS); and the bias (zeros where there is
    none) padded alike. A step of the kernel reads its 64 columns' lines in the order they lie, one stream
    from memory: four streams a few KB apart stream slower (on a Zen 4, W1's int4 products took 1.2x as long)."""
    padded_n = -(-n // GROUP_COLS) * GROUP_COLS
    k = blocks * block
    raw = weights.reshape(n, k // 2)
    values = np.full((padded_n, k), 8, dtype=np.uint8)  # 8 is zero
    values[:n, 0::2] = raw & 0x0F
    values[:n, 1::2] = raw >> 4
    split = values.reshape(padded_n // 16, 16, k // 8, 2, 4).transpose(0, 2, 1, 4, 3)  # [group, k/8, col, b, half]
    lines = (split[..., 0] | (split[..., 1] << 4)).reshape(padded_n // GROUP_COLS, GROUP_COLS // 16, k // 8, 64)
    packed = np.ascontiguousarray(lines.transpose(0, 2, 1, 3)).reshape(padded_n // GROUP_COLS, k // 8, 4 * 64)
    table = np.zeros((blocks, padded_n), dtype=np.float32)
    table[:, :n] = scales.reshape(n, blocks).T
    padded_bias = np.zeros(padded_n, dtype=np.float32)
    if bias is not None:
        padded_bias[:n] = bias
    return packed, table, padded_bias


def rewrite(model: onnx.ModelProto, threads: int, width: int | None = None) -> int:
    """Every MatMulNBits of `model` that the kernel computes the same way (4 bits, symmetric, int8 compute,
    constant weights and bias) as Q4MatMul, in place, on the build of `width` (the widest this CPU runs where
    none is named); returns how many. Weights two products share are packed once."""
    if width is None:
        width = next(iter(widths()), 256)
    if width not in BUILDS:
        raise ValueError(f"no build of the int4 kernel has width {width}: there are {sorted(BUILDS)}")
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    fed = {value.name for value in graph.input}  # initializers a caller may override stay as they are
    chosen = [i for i, node in enumerate(graph.node) if _eligible(node, initializers, fed)]
    if not chosen:
        return 0
    taken = set(initializers) | fed | {name for node in graph.node for name in (*node.input, *node.output)}
    packed: dict[tuple, tuple[str, str, str]] = {}
    added, replaced = [], set()
    for index in chosen:  # every array read before the graph changes: protobuf's views die with removals
        node = graph.node[index]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        bias = node.input[5] if len(node.input) > 5 and node.input[5] else None
        key = (node.input[1], node.input[2], bias, attrs["N"], attrs["block_size"])
        if key not in packed:
            weights = numpy_helper.to_array(initializers[node.input[1]])
            arrays = pack(weights, numpy_helper.to_array(initializers[node.input[2]]), attrs["N"], weights.shape[1],
                          attrs["block_size"], numpy_helper.to_array(initializers[bias]) if bias else None)
            names = tuple(graphs.unused_name(f"{stem}_q4", taken) for stem in (node.input[1], node.input[2],
                                                                    bias or f"{node.input[1]}_bias"))
            added += [numpy_helper.from_array(array, name) for array, name in zip(arrays, names)]
            packed[key] = names
        replaced.update(name for name in (*node.input[1:3], bias) if name)
        graph.node[index].CopyFrom(helper.make_node(
            OP, [node.input[0], *packed[key]], list(node.output), name=node.name, domain=DOMAIN, N=attrs["N"],
            block=attrs["block_size"], threads=threads, width=width))
    native.swap_initializers(graph, replaced, added)
    native.add_domain(model)
    return len(chosen)


# The blocks MatMulNBits computes with int8 activations per block; past 256 its result is another one.
BLOCKS = (32, 64, 128, 256)


def _eligible(node: onnx.NodeProto, initializers: dict, fed: set[str]) -> bool:
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("bits") != 4 or attrs.get("accuracy_level") != 4 or attrs.get("block_size") not in BLOCKS:
        return False
    if any(name for name in node.input[3:5]):  # zero points, group index
        return False
    constants = [name for name in (*node.input[1:3], *node.input[5:6]) if name]
    return all(name in initializers and name not in fed for name in constants) and all(
        initializers[name].data_type == onnx.TensorProto.FLOAT for name in constants[1:])
