"""Weight (and activation) quantization with ONNX Runtime's quantization tools.

- int8: dynamic quantization with per-channel int8 weights for every MatMul with a constant weight,
  the LM head included; activations are quantized per row on every call (`hotrod.optimize.row_scales`),
  so no calibration is needed and a row's answer does not depend on its batch-mates.
- int8-call: the same weights with onnxruntime's own activation quantization, one asymmetric range for
  the whole call: a row's answer depends on the rows beside it.
- int8-static: QDQ (QuantizeLinear / DequantizeLinear around fp32 ops) with per-channel int8 weights for
  every MatMul and Gemm with a constant weight, the LM head included, and uint8 activations whose ranges
  are calibrated once, on feeds recorded from the fp32 graph (min-max, percentile or entropy). ONNX
  Runtime fuses each DequantizeLinear -> MatMul pair into an integer kernel when the session starts.
- int8-weight: block-wise (32) symmetric int8 weights through MatMulNBits, computed with int8
  activations (accuracy level 4): int4's layout and kernel with twice the bits, for models int4 hurts.
- int4: block-wise (32) symmetric int4 weights through MatMulNBits, computed with int8 activations
  (accuracy level 4); batch-1 decoding is bound by weight bytes, and this reads an eighth of fp32's.
  int4-b128 and int4-b256 are the same with blocks of 128 and 256: fewer scales to read and apply, a
  coarser fit.
In all of them the token embedding stays fp32: a Gather reads one row per token, so quantizing it saves
memory but no time, and costs accuracy.

int8 and int8-static weights use 7 of their 8 bits ([-64, 64], onnxruntime's reduce_range). Both multiply
uint8 activations by int8 weights, and on an x86 CPU without VNNI (AVX2 only) onnxruntime's kernel sums
pairs of u8 x s8 products in int16 (vpmaddubsw), which saturates past 32767: 255 * 127 * 2 = 64770 gives
wrong sums (a tiny GPT-2's logits at cosine 0.993 to fp32, errors up to 0.14 on logits of magnitude 0.6),
255 * 64 * 2 = 32640 fits. VNNI's vpdpbusd does not saturate, but an artifact built on one machine runs
on others, so the range is the one that is exact on every x86 CPU, whichever machine built it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx

from hotrod.errors import HotrodError, check_choice
from hotrod.export.onnx import save_model
from hotrod.optimize import graphs
from hotrod.optimize.calibration import graph_feed, spread
from hotrod.optimize.row_scales import per_row_activations

Feed = dict[str, np.ndarray]

# hotrod's calibration method names -> onnxruntime.quantization.CalibrationMethod members.
_ORT_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}

# At most this many feeds per graph are calibrated on, evenly spread over the recorded ones. Min-max keeps
# two numbers per tensor, so feeds cost only time; percentile and entropy histogram every value of every
# calibrated tensor (logits included), which is where the time goes, so they see fewer.
MAX_CALIBRATION_FEEDS = {"minmax": 32, "percentile": 16, "entropy": 16}

# Operators whose constant weight int8-static quantizes. ONNX Runtime's GPT-2 fusion leaves the attention
# output projection a Gemm, so Gemm is here too (ORT runs it as QGemm), or those weights would stay fp32.
_WEIGHT_OPS = ("MatMul", "Gemm")

# Weights in [-64, 64]: exact in onnxruntime's u8 x s8 kernels on every x86 CPU (see the module docstring).
REDUCE_RANGE = True

# Ends the names of the nodes hotrod adds, or names, for ORT's static quantizer.
_ISOLATED = "hotrod_int8_input"


def int8_dynamic(model: onnx.ModelProto, per_row: bool = False) -> onnx.ModelProto:
    """`model` with per-channel int8 weights (7-bit range) in every MatMul with a constant weight,
    activations quantized on every call (one scale per call, or per row with `per_row`). The input model may
    be changed (ONNX's external-data saving moves the weights of a graph above 2 GB out of it), here and in
    the others; use the returned one."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as scratch:
        src, dst = Path(scratch) / "in.onnx", Path(scratch) / "out.onnx"
        large = save_model(model, src) is not None  # the tools read files; big weights go to .data
        with _quiet():
            quantize_dynamic(
                str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, reduce_range=REDUCE_RANGE,
                op_types_to_quantize=["MatMul"], use_external_data_format=large,
                extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        quantized = onnx.load(str(dst), load_external_data=True)
        return prune_initializers(per_row_activations(quantized) if per_row else quantized)


def int8_static(model: onnx.ModelProto, feeds: Sequence[Feed], method: str = "minmax") -> onnx.ModelProto:
    """QDQ int8 with activation ranges calibrated on `feeds` (input dicts recorded from this graph in fp32,
    see calibration.capture_feeds) by `method`; only MatMul / Gemm with a constant weight are quantized.

    The MatMuls between two activations (attention scores and their product with V) stay fp32: their
    operands are the KV cache and softmax probabilities, whose ranges vary per step and per position
    far more than a layer's input does, and for the short sequences of decoding they are a small share
    of the work. Only the inputs of the quantized nodes are quantized, never outputs, so logits, hidden
    states and the KV cache leave every graph in fp32, and so does everything fusion produced (layer
    norms, GELU, ...) and the residual stream.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    check_choice("calibration method", method, tuple(_ORT_METHODS))
    if not feeds:
        raise HotrodError("int8-static calibrates activation ranges and needs feeds recorded from the fp32 graph; "
                          "none were given")
    if not _weight_op_nodes(model.graph):
        return prune_initializers(model)
    with tempfile.TemporaryDirectory() as scratch:  # ORT's augmented calibration models go to its own temp dirs
        src, dst = Path(scratch) / "in.onnx", Path(scratch) / "out.onnx"
        large = save_model(model, src) is not None  # the tools read files; big weights go to .data
        nodes = _isolate_int8_inputs(src)
        reader = _FeedReader(calibration_rows(src, spread(feeds, MAX_CALIBRATION_FEEDS[method])))
        with _quiet():
            quantize_static(
                str(src), str(dst), reader, quant_format=QuantFormat.QDQ,
                # uint8 activations with int8 weights: x86's integer GEMM (VNNI's vpdpbusd, AMX) multiplies u8
                # by s8, and ONNX Runtime recommends U8S8 for x86. Measured on ORT 1.31: the two are as
                # accurate (an asymmetric range has 256 levels either way), but with int8 activations ORT's
                # CPU optimizer leaves the MatMuls that share one quantized input (Q/K/V) as an fp32 MatMul
                # on dequantized weights, slower than fp32; with uint8 every one becomes MatMulIntegerToFloat,
                # QLinearMatMul or QGemm. Weights in 7 bits, exact without VNNI too (the module docstring).
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                reduce_range=REDUCE_RANGE, op_types_to_quantize=list(_WEIGHT_OPS), nodes_to_quantize=nodes,
                use_external_data_format=large,
                calibrate_method=getattr(CalibrationMethod, _ORT_METHODS[method]),
                extra_options={
                    "OpTypesToExcludeOutputQuantization": list(_WEIGHT_OPS),
                    # One row per calibration pass (`calibration_rows`): ranges are merged after each, so
                    # histograms hold one row's tensors at a time, and rows of different sequence lengths
                    # never have to be stacked into one array.
                    "CalibStridedMinMax": 1,
                },
            )
        return prune_initializers(_drop_isolation(onnx.load(str(dst), load_external_data=True)))


def weight_only(model: onnx.ModelProto, bits: int, block_size: int = 32) -> onnx.ModelProto:
    """Block-wise symmetric weights of `bits` bits through MatMulNBits, computed with int8 activations."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=True, accuracy_level=4)
    with _quiet():
        quantizer.process()
    return prune_initializers(fold_bias(quantizer.model.model))


def fold_bias(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each MatMulNBits followed only by an Add of a constant [N] vector takes that vector as its own bias
    input, and the Add goes. The quantizer leaves every bias Add standing, and at batch-1 decoding each is
    a call of its own for a few thousand numbers (GPT-2: 48 Adds a step, each a dispatch for little work;
    the same logits without them)."""
    graph = model.graph
    vectors = {t.name: list(t.dims) for t in graph.initializer}
    readers = graphs.readers(graph)
    outputs = {o.name for o in graph.output}
    folded: set[int] = set()
    for node in graph.node:
        add = _bias_add(node, readers, outputs)
        if add is None:
            continue
        bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
        if vectors.get(bias) != [onnx.helper.get_attribute_value(_attribute(node, "N"))]:
            continue
        inputs = [*node.input, *[""] * (5 - len(node.input))]
        node.input[:] = [*inputs[:5], bias]
        node.output[0] = add.output[0]
        folded.add(id(add))
    kept = [node for node in graph.node if id(node) not in folded]
    del graph.node[:]
    graph.node.extend(kept)
    return model


def _bias_add(node: onnx.NodeProto, readers: dict, outputs: set[str]) -> onnx.NodeProto | None:
    """The Add that alone reads `node`'s output, where `node` is a MatMulNBits without a bias yet."""
    if node.op_type != "MatMulNBits" or (len(node.input) > 5 and node.input[5]) or node.output[0] in outputs:
        return None
    users = readers.get(node.output[0], [])
    return users[0] if len(users) == 1 and users[0].op_type == "Add" else None


def _attribute(node: onnx.NodeProto, name: str) -> onnx.AttributeProto:
    return next(a for a in node.attribute if a.name == name)


def _weight_op_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The MatMul / Gemm nodes whose second input is an fp32 weight: the ones int8-static quantizes."""
    weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    return [node for node in graph.node if node.op_type in _WEIGHT_OPS and node.input[1] in weights]


def _isolate_int8_inputs(path: Path) -> list[str]:
    """Prepare the graph at `path` for ORT's QDQ quantizer; returns the names of the nodes to quantize.

    Two things the quantizer gets wrong on hotrod's graphs are set right here:
    - it skips, with a mere warning, every tensor whose type ONNX's shape inference cannot find, and that
      inference does not know the contrib operators fusion introduces (SkipLayerNormalization, FastGelu,
      ...), so most layer inputs would silently stay fp32. A MatMul's inputs share one type, so an fp32
      weight makes its activation fp32: declared here, it is seen.
    - it routes every reader of a quantized tensor through the DequantizeLinear, so BERT's residual
      stream (a layer norm's output, read by the next Q/K/V and by the next residual add) would be
      rounded to uint8 as well. Each quantized activation is read here through an Identity that only the
      quantized nodes use, so the other readers keep the fp32 tensor; `_drop_isolation` removes it after.
      The same holds for constants: a Gemm's bias becomes int32 behind a DequantizeLinear, and a layer
      norm reading the same initializer (an optimizer merges equal constants: zero biases and betas) would
      read it dequantized. Each constant a quantized node shares with another reader is its own copy here.
    """
    model = onnx.load(str(path), load_external_data=False)
    nodes = _weight_op_nodes(model.graph)
    for index, node in enumerate(nodes):
        node.name = node.name or f"{node.op_type}_{index}_{_ISOLATED}"  # the quantizer selects nodes by name
    _own_constants(model.graph, nodes)  # first: `_isolate` puts copies of the nodes in the graph
    _isolate(model.graph, nodes)
    _declare_fp32(model.graph, {node.input[0] for node in nodes})
    onnx.save_model(model, str(path))  # external weights, if any, stay where they are
    return [node.name for node in nodes]


def _isolate(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """Make `nodes` read their activation through an Identity of their own where anything else reads it too."""
    chosen, shared = {id(node) for node in nodes}, _read_elsewhere(graph, nodes)
    ordered, copies = [], {}
    for node in graph.node:
        source = node.input[0] if id(node) in chosen else None
        if source in shared:
            if source not in copies:  # placed before its first reader, so the order stays topological
                copies[source] = f"{source}/{_ISOLATED}"
                ordered.append(onnx.helper.make_node("Identity", [source], [copies[source]], name=copies[source]))
            node.input[0] = copies[source]
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)


def _own_constants(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """Give `nodes` their own copy of each initializer (weight, bias) that a node not among them, or a graph
    output, reads too; the copy keeps an external tensor's reference to the same bytes."""
    shared = _read_elsewhere(graph, nodes)
    initializers = {init.name: init for init in graph.initializer}
    taken = set(initializers) | {name for node in graph.node for name in (*node.input, *node.output)}
    copies: dict[str, str] = {}
    for node in nodes:
        for index in range(1, len(node.input)):
            name = node.input[index]
            if name not in shared or name not in initializers:
                continue
            if name not in copies:
                copy = onnx.TensorProto()
                copy.CopyFrom(initializers[name])
                copy.name = copies[name] = graphs.unused_name(f"{name}/{_ISOLATED}", taken)
                graph.initializer.append(copy)
            node.input[index] = copies[name]


def _read_elsewhere(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> set[str]:
    """What the graph's other nodes (their If / Loop / Scan bodies too) and its outputs read."""
    chosen = {id(node) for node in nodes}
    return graphs.read_names(graph, [node for node in graph.node if id(node) not in chosen])


def _declare_fp32(graph: onnx.GraphProto, names: set[str]) -> None:
    """Give the tensors in `names` that have no type yet an fp32 type (shape left unknown)."""
    typed = {v.name for v in [*graph.input, *graph.value_info, *graph.output]}
    for name in sorted(names - typed):
        graph.value_info.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))


def _drop_isolation(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the Identity nodes `_isolate_int8_inputs` added; their readers read the source instead."""
    graph = model.graph
    added = [node for node in graph.node if node.op_type == "Identity" and node.name.endswith(_ISOLATED)]
    source = {node.output[0]: node.input[0] for node in added}
    kept = [node for node in graph.node if node.output[0] not in source]
    for node in kept:
        node.input[:] = [source.get(name, name) for name in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    value_info = [v for v in graph.value_info if v.name not in source]
    del graph.value_info[:]
    graph.value_info.extend(value_info)
    return model


def calibration_rows(path: Path, feeds: Sequence[Feed]) -> list[Feed]:
    """The feeds restricted to the inputs of the graph at `path`, each batched feed split into its rows.

    ONNX Runtime's calibrator runs a copy of the graph with a ReduceMin and a ReduceMax beside every tensor
    it calibrates (for percentile and entropy, the tensor itself as an output), and that run keeps far more
    of a feed's activations alive than the graph alone does: BERT-large's, calibrated on one batch of
    8 x 384 tokens, added 4.8 GB to the build's peak (0.2 GB a layer); row by row, 1.2 GB. Each row keeps
    its padding, so it sees what it saw in its batch and min-max ranges over the rows are the batch's. The
    batch axis is the one the graph's inputs name "batch" (`hotrod.contracts`); an input without one (a
    decoding step's total length) goes with every row as it is.
    """
    inputs = onnx.load(str(path), load_external_data=False).graph.input
    axes = {i.name: _batch_axis(i) for i in inputs}
    rows = []
    for feed in feeds:
        feed = graph_feed(list(axes), feed)
        sizes = {feed[name].shape[axis] for name, axis in axes.items() if axis is not None}
        if len(sizes) != 1 or (count := sizes.pop()) <= 1:
            rows.append(feed)
            continue
        rows += [{name: value if axes[name] is None else np.take(value, [row], axis=axes[name])
                  for name, value in feed.items()} for row in range(count)]
    return rows


def _batch_axis(value: onnx.ValueInfoProto) -> int | None:
    dims = value.type.tensor_type.shape.dim
    return next((axis for axis, dim in enumerate(dims) if dim.dim_param == "batch"), None)


class _FeedReader:
    """An onnxruntime CalibrationDataReader over recorded feeds; `set_range` lets ORT calibrate in slices."""

    def __init__(self, feeds: list[Feed]):
        self.feeds = feeds
        self._pending: Iterator[Feed] = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self._pending, None)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._pending = iter(self.feeds[start_index:end_index])

    def __len__(self) -> int:
        return len(self.feeds)


@contextlib.contextmanager
def _quiet():
    """Hush the quantizer's progress prints and its advice to pre-process, which hotrod's graphs don't need."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def prune_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop weights (and nodes) nothing reads any more: the quantizers leave the fp32 originals behind."""
    import onnx_ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    graph = onnx_ir.from_proto(model)
    RemoveUnusedNodesPass()(graph)
    return onnx_ir.to_proto(graph)
