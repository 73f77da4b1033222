"""In-place decoder attention for GPUs: GroupQueryAttention rewritten into ops every provider has in fp32.

Decoder-only graphs update their KV cache buffers in place with ONNX Runtime's `GroupQueryAttention`
(`hotrod.models.attention`). The CPU provider runs it in fp32; the CUDA provider has it only in fp16/bf16,
and would move an fp32 node to the CPU, copying every cache across the bus at every step; the CPU
kernel refuses head sizes that are not a multiple of 8. A graph built for a GPU, or for such heads,
therefore has each such node rewritten, keeping the same graph contract:

    q, k, v [B, Sq, H*D]; past_k, past_v [B, H, M, D] (the buffers); seqlens_k [B]; total (scalar)
    starts    = 0 if total == Sq (a first prompt) else seqlens_k + 1 - Sq
    positions = starts + arange(Sq)                                      [B, Sq], shared by every layer
    present_k = ScatterND(past_k, (b, h, positions), k as [B, H, Sq, D])  the same for v
    bias      = 0 where key <= position and key <= seqlens_k, else min    [B, 1, Sq, total], shared
                (plus the node's own attention bias, if it has one)
    out       = MultiHeadAttention(q, present_k[:, :, :total], present_v[:, :, :total], bias)

ScatterND skips its input-to-output copy when both are the same memory, which is what the runtime
binds (the cache buffer as past and as present), so the cache is still written in place, not copied.
Attention reads each row up to the longest row, masked, where GroupQueryAttention stops at each row's
own length: more reads at ragged batch sizes, the same answers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.optimize.fusion import fused_op_counts

IN_PLACE_OP = "GroupQueryAttention"
_DOMAIN = "com.microsoft"
_PREFIX = "portable_attention/"


def has_in_place_attention(model: onnx.ModelProto) -> bool:
    return any(node.op_type == IN_PLACE_OP for node in model.graph.node)


def portable_attention(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """`model` with every GroupQueryAttention rewritten as above; returns it and its fused-op counts."""
    graph = model.graph
    nodes = list(graph.node)
    targets = [n for n in nodes if n.op_type == IN_PLACE_OP]
    if not targets:
        return model, fused_op_counts(model)
    builder = _Builder(graph)
    shared: dict[tuple[str, str], tuple[str, str, str]] = {}  # every layer's q has the same shape
    rewritten: list[onnx.NodeProto] = []
    biases: dict[tuple[str, str], str] = {}
    for node in nodes:
        if node.op_type != IN_PLACE_OP:
            rewritten.append(node)
            continue
        q, k, v, past_k, past_v, seqlens, total = node.input[:7]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("kv_num_heads", attrs["num_heads"]) != attrs["num_heads"] or attrs.get("do_rotary", 0):
            raise ValueError(f"{node.name}: only plain multi-head GroupQueryAttention can be rewritten")
        heads = attrs["num_heads"]
        key = (seqlens, total)
        if key not in shared:
            shared[key] = builder.masks(q, seqlens, total, heads)
        indices, bias, total64 = shared[key]
        builder.nodes = []
        extra = node.input[10] if len(node.input) > 10 else ""  # the node's own bias (T5's positions)
        if extra:
            if (bias, extra) not in biases:
                biases[bias, extra] = builder.node("Add", [bias, extra])
            bias = biases[bias, extra]
        used = []
        for new, past, present in ((k, past_k, node.output[1]), (v, past_v, node.output[2])):
            builder.node("ScatterND", [past, indices, builder.heads_first(new, heads)], [present])
            used.append(builder.prefix_of(present, total64))
        builder.node("MultiHeadAttention", [q, used[0], used[1], "", "", bias], [node.output[0]], domain=_DOMAIN,
                     num_heads=heads, scale=attrs.get("scale", 0.0))
        rewritten += builder.pending + builder.nodes
        builder.pending = []
    del graph.node[:]
    graph.node.extend(rewritten)
    if not any(op.domain == _DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_DOMAIN, 1))
    return model, fused_op_counts(model)


class _Builder:
    """Appends nodes and constants with unique names under one prefix."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.count = 0
        self.constants: dict[tuple[str, bytes, tuple[int, ...]], str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.pending: list[onnx.NodeProto] = []  # the shared nodes, placed before the first node using them

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{_PREFIX}{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str) -> str:
        key = (value.dtype.str, value.tobytes(), value.shape)
        if key not in self.constants:
            self.constants[key] = self.name(hint)
            self.graph.initializer.append(numpy_helper.from_array(value, self.constants[key]))
        return self.constants[key]

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, domain: str = "", **attrs) -> str:
        outputs = outputs or [self.name(op.lower())]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=self.name(op), domain=domain, **attrs))
        return outputs[0]

    def masks(self, q: str, seqlens: str, total: str, heads: int) -> tuple[str, str, str]:
        """ScatterND indices [B, H, Sq, 3], additive bias [B, 1, Sq, total] and total as int64 [1]."""
        self.nodes = []
        i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
        shape = self.node("Shape", [q])
        batch = self.node("Slice", [shape, self.const(i64(0), "at0"), self.const(i64(1), "at1")])
        width = self.node("Slice", [shape, self.const(i64(1), "at1"), self.const(i64(2), "at2")])
        ends = self.node("Add", [self.node("Cast", [seqlens], to=TensorProto.INT64), self.const(i64(1), "one")])
        total64 = self.node("Reshape", [self.node("Cast", [total], to=TensorProto.INT64), self.const(i64(1), "shape1")])
        first = self.node("Equal", [total64, width])
        starts = self.node("Where", [first, self.const(i64(0), "zero"), self.node("Sub", [ends, width])])
        steps = self.node("Range", [self.const(np.int64(0), "start"), self._scalar(width),
                                    self.const(np.int64(1), "delta")])
        positions = self.node("Add", [self._unsqueeze(starts, 1), self._unsqueeze(steps, 0)])  # [B, Sq]
        keys = self.node("Range", [self.const(np.int64(0), "start"), self._scalar(total64),
                                   self.const(np.int64(1), "delta")])
        keys3 = self.node("Reshape", [keys, self.const(i64(1, 1, -1), "keys_shape")])  # [1, 1, T]
        causal = self.node("LessOrEqual", [keys3, self._unsqueeze(positions, 2)])
        inside = self.node("Less", [keys3, self.node("Reshape", [ends, self.const(i64(-1, 1, 1), "ends_shape")])])
        allowed = self.node("And", [causal, inside])
        zero, low = np.array(0, np.float32), np.array(np.finfo(np.float32).min, np.float32)
        bias = self.node("Where", [allowed, self.const(zero, "allowed"), self.const(low, "masked")])
        bias = self._unsqueeze(bias, 1)
        # (b, h, position) for every new key: [B, H, Sq, 3]
        target = self.node("Concat", [batch, self.const(i64(heads), "heads"), width], axis=0)
        rows = self.node("Reshape", [self.node("Range", [self.const(np.int64(0), "start"), self._scalar(batch),
                                                          self.const(np.int64(1), "delta")]),
                                     self.const(i64(-1, 1, 1), "rows_shape")])
        head_ids = self.const(np.arange(heads, dtype=np.int64).reshape(1, heads, 1), "head_ids")
        columns = [self.node("Expand", [part, target]) for part in (rows, head_ids, self._unsqueeze(positions, 1))]
        indices = self.node("Concat", [self._unsqueeze(c, 3) for c in columns], axis=3)
        self.pending += self.nodes
        return indices, bias, total64

    def heads_first(self, x: str, heads: int) -> str:
        """[B, Sq, H*D] -> [B, H, Sq, D]"""
        split = self.node("Reshape", [x, self.const(np.array([0, 0, heads, -1], np.int64), "heads_shape")])
        return self.node("Transpose", [split], perm=[0, 2, 1, 3])

    def prefix_of(self, cache: str, total64: str) -> str:
        """cache[:, :, :total]"""
        return self.node("Slice", [cache, self.const(np.array([0], np.int64), "from"), total64,
                                   self.const(np.array([2], np.int64), "axis2")])

    def _unsqueeze(self, x: str, axis: int) -> str:
        return self.node("Unsqueeze", [x, self.const(np.array([axis], np.int64), "axis")])

    def _scalar(self, x: str) -> str:
        return self.node("Squeeze", [x, self.const(np.array([0], np.int64), "axis0")])
