"""LayerNormalization on hotrod's kernel (`hotrod/native/norm.c`): the same bits as onnxruntime's, several rows at
a time, and where the next product quantizes its output per row, that quantization in the same op.

onnxruntime's CPU LayerNormalization sums each row in two chains of dependent additions, one row after another:
at a BERT encoder's 128 x 768 it takes about as long as one of the layer's products takes to read its weights.
hotrod's LayerNorm runs the same chains, in the same order, for several rows side by side, so the answers are
the same to the bit; LayerNormRows also quantizes each normalized row as QuantizeRows does
(`hotrod.runtime.rows`), while the row is in the cache, LayerNormQuantized as a calibrated graph's
QuantizeLinear reading it does (int8-static's next product's input: one scale and zero point), and
LayerNormRounded rounds it to bf16 as the bf16 products that read it round their rows (bf16-products' next
product's input: `hotrod.runtime.bf16`).

The arithmetic is onnxruntime's as of its AVX2 code; another version (or another CPU's code path) may sum
otherwise. So before a graph takes the op, a probe runs onnxruntime's own LayerNormalization and the kernel on
the same rows (once a process for each width and epsilon), and the graph takes it only where the two agree to
the bit. Left alone: a LayerNormalization over other than the last axis, with gamma or beta not constant [K], K
not a multiple of 8, its statistics read, or reading the embeddings' sum (which onnxruntime's session may fuse
into its EmbedLayerNormalization).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from hotrod.optimize import graphs
from hotrod.runtime import bf16, i8, native, rows

OP = "LayerNorm"
ROWS_OP = "LayerNormRows"  # the same, its output also quantized per row for the next product (QuantizeRows's outputs)
FIXED_OP = "LayerNormQuantized"  # the same, its output also quantized as the QuantizeLinear that read it
ROUNDED_OP = "LayerNormRounded"  # the same, its output also rounded to bf16 for the bf16 products that read it
OPS = (OP, ROWS_OP, FIXED_OP, ROUNDED_OP)
_STEP = 8  # K must be a multiple: onnxruntime takes other paths for a row's tail


def rewrite(model: onnx.ModelProto) -> int:
    """Every LayerNormalization of `model` the kernel computes as onnxruntime does as LayerNorm, and as
    LayerNormRows where a QuantizeRows reads its output, in place; returns how many."""
    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    fixed = graphs.fixed_initializers(graph)  # what no caller may override
    producers, readers = graphs.producers(graph), graphs.readers(graph)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    dropped: set[int] = set()
    names = {name for node in graph.node for name in (*node.input, *node.output)} | set(constants)
    count = 0
    for node in graph.node:
        taken = _taken(node, constants, producers, opset)
        if taken is not None and same_as_onnxruntime(*taken):
            _replace(node, *taken, readers, fixed, dropped, names)
            count += 1
    graphs.drop_nodes(graph, dropped)
    if count:
        native.add_domain(model)
    return count


def _taken(node: onnx.NodeProto, constants: dict, producers: dict, opset: int) -> tuple[int, float] | None:
    """The width and epsilon of a LayerNormalization the op computes (see the module's docstring); None for any
    other."""
    if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.input) != 3:
        return None
    if opset < 17:  # onnxruntime's older contrib op of that name, whose input may be another type than gamma's
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("axis", -1) != -1 or attrs.get("stash_type", 1) != 1 or set(attrs) - {"axis", "epsilon", "stash_type"}:
        return None
    if any(node.output[1:]):  # its mean or inverse deviation asked for
        return None
    shapes = [constants.get(name) for name in node.input[1:]]
    if any(init is None or init.data_type != TensorProto.FLOAT or len(init.dims) != 1 for init in shapes):
        return None
    width = shapes[0].dims[0]
    if width <= 0 or width % _STEP or shapes[1].dims[0] != width or _embeddings(node.input[0], producers):
        return None
    return int(width), float(attrs.get("epsilon", 1e-5))


def _embeddings(name: str, producers: dict) -> bool:
    """Whether `name` is a sum of looked-up rows (an Add reading a Gather, directly or through one more Add)."""
    node = producers.get(name)
    if node is None or node.op_type != "Add":
        return False
    inner = [producers.get(value) for value in node.input]
    if any(n is not None and n.op_type == "Gather" for n in inner):
        return True
    return any(n is not None and n.op_type == "Add" and any(
        (p := producers.get(value)) is not None and p.op_type == "Gather" for value in n.input) for n in inner)


def _replace(node: onnx.NodeProto, width: int, epsilon: float, readers: dict, constants: dict, dropped: set[int],
             names: set[str]) -> None:
    """`node` as LayerNorm, in place; as LayerNormRows, taking the outputs of the one QuantizeRows that reads
    its output, or as LayerNormQuantized, taking the input scale and zero point and the output of a
    QuantizeLinear with one of each that reads it (either joins `dropped`), where there is one; or as
    LayerNormRounded, giving the bf16 products that read it their rows rounded (a name not in `names`)."""
    output = node.output[0]
    quantizing = [n for n in readers.get(output, []) if n.op_type == rows.OP and n.domain == native.DOMAIN]
    static = [n for n in readers.get(output, []) if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx")
              and i8.quantizes_static(n, constants)]
    inputs, outputs, op = list(node.input), [output], OP
    # bf16 products reading it as their rows (`hotrod.runtime.bf16`, rewritten before): they read it rounded
    products = [n for n in readers.get(output, []) if n.op_type in bf16.OPS and n.domain == native.DOMAIN
                and n.input[0] == output and output not in n.input[1:3]]
    if products and not quantizing and not static and width % bf16.DEPTH == 0:
        rounded = graphs.unused_name(f"{output}_bf16", names)
        for product in products:
            product.input[0] = rounded
        outputs, op = outputs + [rounded], ROUNDED_OP
    elif len(quantizing) == 1:
        outputs, op = outputs + list(quantizing[0].output), ROWS_OP
        dropped.add(id(quantizing[0]))
    elif static:
        inputs, outputs, op = inputs + list(static[0].input[1:3]), outputs + [static[0].output[0]], FIXED_OP
        dropped.add(id(static[0]))
    node.CopyFrom(helper.make_node(op, inputs, outputs, name=node.name, domain=native.DOMAIN, epsilon=epsilon))


@functools.cache
def same_as_onnxruntime(width: int, epsilon: float) -> bool:
    """Whether onnxruntime's LayerNormalization and the kernel give the same bits for rows of `width` values
    with `epsilon`: rows of assorted scales and offsets, 15 of them, so that the kernel's every group size (8, 4,
    2 and 1 rows side by side) is met."""
    kernel = _kernel()
    if kernel is None:
        return False
    rng = np.random.default_rng(width)
    count = 15
    x = rng.standard_normal((count, width)) * np.logspace(-3, 4, count)[:, None] + rng.standard_normal((count, 1)) * 10
    x, gamma, beta = x.astype(np.float32), *rng.standard_normal((2, width)).astype(np.float32)
    ours = np.empty_like(x)
    kernel(x.ctypes.data, count, width, gamma.ctypes.data, beta.ctypes.data, epsilon, ours.ctypes.data, None, None,
           None)
    return bool(np.array_equal(ours, _onnxruntime(x, gamma, beta, epsilon)))


def _onnxruntime(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, epsilon: float) -> np.ndarray:
    node = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=epsilon)
    graph = helper.make_graph(
        [node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(beta, "beta")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@functools.cache
def _kernel():
    """The library's hotrod_layer_norm, typed; None where the library is not here."""
    path = native.library()
    if path is None:
        return None
    function = ctypes.CDLL(str(path)).hotrod_layer_norm
    pointer = ctypes.c_void_p
    function.argtypes = [pointer, ctypes.c_int64, ctypes.c_int64, pointer, pointer, ctypes.c_float, pointer,
                         pointer, pointer, pointer]
    function.restype = None
    return function
