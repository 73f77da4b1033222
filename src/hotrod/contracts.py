"""The graph contracts of each kind: which graphs exist, their inputs and outputs, and dynamic axes.

These are generic: every family of a kind exports graphs with exactly these names, so the runtime and
the decoding loop can drive any family without knowing it. Symbolic axes name the dynamic dimensions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hotrod import tasks
from hotrod.registry import Dims, Kind

INT64 = "int64"
INT32 = "int32"
FLOAT32 = "float32"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    axes: tuple[str | int, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.axes)}


@dataclass(frozen=True)
class GraphIO:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    # Cached: every graph run reads them (a frozen dataclass still takes cached_property's own writes).
    @functools.cached_property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @functools.cached_property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def kv_names(prefix: str, layers: int) -> list[str]:
    """[prefix.0.key, prefix.0.value, prefix.1.key, ...], the flat order graphs take and return caches in."""
    return [f"{prefix}.{i}.{part}" for i in range(layers) for part in ("key", "value")]


def _ids(name: str, axis: str = "sequence", rows: str = "batch") -> TensorSpec:
    return TensorSpec(name, INT64, (rows, axis))


def _kv(prefix: str, dims: Dims, layers: int, axis: str, rows: str = "batch") -> tuple[TensorSpec, ...]:
    shape = (rows, dims.num_heads, axis, dims.head_dim)
    return tuple(TensorSpec(n, FLOAT32, shape) for n in kv_names(prefix, layers))


def _lengths() -> tuple[TensorSpec, ...]:
    """What an in-place cache needs: each row's length after the call, minus one (`seqlens_k`, as ONNX
    Runtime's GroupQueryAttention names it), and the longest of those lengths."""
    return TensorSpec("seqlens_k", INT32, ("batch",)), TensorSpec("total_sequence_length", INT32, ())


def encoder_io(dims: Dims) -> dict[str, GraphIO]:
    """One graph; its outputs are what the task's head returns (its spec's `outputs`), named as transformers'
    output fields."""
    inputs = [_ids("input_ids"), _ids("attention_mask")]
    if dims.type_vocab_size:
        inputs.append(_ids("token_type_ids"))
    return {"encoder": GraphIO("encoder", tuple(inputs), _head_outputs(dims))}


def _head_outputs(dims: Dims) -> tuple[TensorSpec, ...]:
    """The outputs the task's spec declares, with this model's sizes."""
    spec = tasks.get(dims.task) if dims.task else tasks.bare("encoder")  # sizes alone: the bare encoder's
    return tuple(TensorSpec(out.name, FLOAT32, out.shape(dims)) for out in spec.outputs)


def decoder_io(dims: Dims) -> dict[str, GraphIO]:
    """One graph for prefill and steps. The cache is a buffer of `cache_capacity` positions per row that
    the graph updates in place (`present.*` is `past_key_values.*`, bound to the same memory): rows have
    their own lengths (`seqlens_k` = length after this call - 1), so nothing is padded on the left.
    A prefill passes right-padded prompts and `total_sequence_length` equal to their width; a step
    passes one token per row and the longest row's new length."""
    layers = dims.num_layers
    inputs = (
        _ids("input_ids"),
        _ids("position_ids"),
        *_lengths(),
        _ids("logits_positions", "logits_sequence"),
        *_kv("past_key_values", dims, layers, "cache_capacity"),
    )
    logits = TensorSpec("logits", FLOAT32, ("batch", "logits_sequence", dims.vocab_size))
    outputs = (logits, *_kv("present", dims, layers, "cache_capacity"))
    return {"decoder": GraphIO("decoder", inputs, outputs)}


def seq2seq_io(dims: Dims) -> dict[str, GraphIO]:
    """Three graphs: the encoder; the first decoder step over a start token, which also returns every
    layer's cross K/V and the step's self K/V; and the step, one token per row over self-attention cache
    buffers it updates in place (`present.*` bound to `past_key_values.*`), each row at its own length.
    The step takes one token per row when decoding, or a token and a draft to verify in one pass."""
    layers = dims.num_decoder_layers
    hidden = TensorSpec("encoder_hidden_states", FLOAT32, ("batch", "encoder_sequence", dims.hidden_size))
    enc_mask = _ids("encoder_attention_mask", "encoder_sequence")
    logits = TensorSpec("logits", FLOAT32, ("batch", "sequence", dims.vocab_size))
    cross = _kv("cross", dims, layers, "encoder_sequence")
    encoder = GraphIO("encoder", (_ids("input_ids", "encoder_sequence"), _ids("attention_mask", "encoder_sequence")), (hidden,))
    init = GraphIO(
        "decoder_init",
        (_ids("decoder_input_ids"), enc_mask, hidden),
        (logits, *_kv("present", dims, layers, "sequence"), *cross),
    )
    # The step's rows are g consecutive rows per source (its beams or samples; g = 1 in a server's batch),
    # reading their source's one copy of the cross K/V and encoder mask (`hotrod.models.seq2seq`).
    sources = (_ids("encoder_attention_mask", "encoder_sequence", "sources"),
               *_kv("cross", dims, layers, "encoder_sequence", "sources"))
    step = GraphIO(
        "decoder",
        (_ids("decoder_input_ids"), *_lengths(), sources[0], *_kv("past_key_values", dims, layers, "cache_capacity"),
         *sources[1:]),
        (logits, *_kv("present", dims, layers, "cache_capacity")),
    )
    return {"encoder": encoder, "decoder_init": init, "decoder": step}


_CONTRACTS = {"encoder": encoder_io, "decoder": decoder_io, "seq2seq": seq2seq_io}


def graph_contracts(kind: Kind, dims: Dims) -> dict[str, GraphIO]:
    return _CONTRACTS[kind](dims)
