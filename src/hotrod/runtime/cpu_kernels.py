"""Which of hotrod's CPU kernels a graph runs on as it is loaded (`hotrod.runtime.native`): the int4 products
(`hotrod.runtime.q4`), the int8 products (`hotrod.runtime.i8`), per-row int8 quantization
(`hotrod.runtime.rows`), LayerNormalization (`hotrod.runtime.norm`), and bf16 products and attention where the
build asked for them (`hotrod.runtime.bf16`, `hotrod.runtime.attention`), each where this CPU runs it and this
machine's measurement did not leave it out (`hotrod.runtime.kernel_choice`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort

from hotrod.asks import ATTENTION_KEY, PRODUCTS_KEY
from hotrod.runtime import attention, bf16, i8, kernel_choice, native, norm, q4, rows


@dataclass(frozen=True)
class KernelGraph:
    path: Path  # the rewritten graph, a temporary file
    ops: frozenset[str]  # hotrod's ops in it

    def options(self, options: ort.SessionOptions) -> ort.SessionOptions:
        """`options` with the kernels' library (its ops run on onnxruntime's own threads)."""
        native.use_library(options)
        return options


@contextlib.contextmanager
def kernel_graph(path: Path, threads: int) -> Iterator[KernelGraph | None]:
    """The graph at `path` with what hotrod's kernels compute rewritten to their ops, for the span of the
    block; None where none applies (or the library is missing, or this CPU cannot run it)."""
    out = kernel_choice.left_out(kernel_choice.artifact_key(path.parent))
    int4 = q4.library() is not None and kernel_choice.INT4 not in out  # elsewhere an int4 graph is not even parsed
    int8 = i8.available() and kernel_choice.INT8 not in out
    calibrated = (b"DequantizeLinear",) if int8 else ()  # int8-static's products
    attend = attention.available() and kernel_choice.ATTENTION not in out
    asked = (ATTENTION_KEY.encode(),) if attend else ()  # a build that asked for bf16 or int8 attention
    products = bf16.available() and kernel_choice.BF16 not in out
    asked += (PRODUCTS_KEY.encode(),) if products else ()  # or bf16 products
    model = native.loadable(path, ((b"MatMulNBits",) if int4 else ()) + (rows.SHARED.encode(),) + calibrated + asked)
    ops = set()
    if model is not None and int4 and q4.rewrite(model, threads):
        ops.add(q4.OP)
    if model is not None and int8 and i8.rewrite(model):
        ops.add(i8.OP)
        if i8.quantize_static(model):
            ops.add(i8.QUANTIZED_OP)
    if model is not None and products and bf16.rewrite(model):
        bf16.round_outputs(model)
        ops.update(node.op_type for node in model.graph.node if node.op_type in bf16.OPS)
    if model is not None and kernel_choice.ROWS not in out and rows.rewrite(model):
        ops.add(rows.OP)
        if i8.OP in ops and i8.quantize_outputs(model):
            ops.add(i8.ROWS_OP)
    if model is not None and kernel_choice.LAYERNORM not in out and norm.rewrite(model):
        ops.update(node.op_type for node in model.graph.node if node.op_type in norm.OPS)
    if model is not None and attend:
        ops |= _attention(model, kernel_choice.ATTENTION_PAIRS in out)
    with native.graph_file(model if ops else None) as file:
        yield KernelGraph(file, frozenset(ops)) if file is not None else None


def _attention(model: onnx.ModelProto, without_pairs: bool) -> set[str]:
    """The attention rewritten to hotrod's (on FMAs where the path on VDPBF16PS is left out); its ops, with the
    name of the path where it is VDPBF16PS's or VPDPBUSD's (`attention.PATHS`), so that the tune and the bench can
    tell them apart."""
    with attention.pairs_left_out() if without_pairs else contextlib.nullcontext():
        chosen = attention.path(attention.asked(model) or "bf16")
        if not attention.rewrite(model):
            return set()
        ops = {attention.OP} | ({attention.PATHS[chosen]} if chosen in attention.PATHS else set())
    if attention.quantize_static(model):
        ops.add(attention.QUANTIZED_OP)
    return ops
