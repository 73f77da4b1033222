"""The static engine: the lean modules on a GPU with every shape fixed, replayed as CUDA graphs.

It runs the same graph contracts as ONNX Runtime (`hotrod.contracts`), so the decoding states and the
one decoding loop drive it unchanged. What makes it fast:

- weights cast once (bf16, fp16 with measured fp32 islands, or int8 weight-only: `hotrod.runtime.cast`);
- cache buffers lent from a pool of batch-bucketed bases (`hotrod.runtime.pool`), written in place at
  each row's length, so a step allocates and copies no cache;
- attention over a static span (`total_sequence_length` becomes a Python int: the buffer's capacity
  for a step, the prompt's width for a prefill), through `scaled_dot_product_attention`, with no value
  read back to the host: each call can be recorded as a CUDA graph and replayed (`hotrod.runtime.graphs`),
  one per batch bucket and cache capacity;
- optionally `torch.compile` (inductor) over each graph, which fuses norms, bias + GELU and residual
  adds into a few Triton kernels before the recording.

A call whose cache tensors did not come from the pool (a buffer made by a copy elsewhere) runs eagerly
at its own batch size: slower, never wrong. On a CPU the same code runs eagerly; the tests use that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.activations import NewGELUActivation

from hotrod import precisions
from hotrod.batching import CALL_OVERHEAD_TOKENS
from hotrod.contracts import GraphIO
from hotrod.errors import HotrodError
from hotrod.models.common import FusedProjection
from hotrod.runtime.base import Held, contract_of, merged
from hotrod.runtime.cast import Int8Linear, cast_module, quantize_linears, replace_submodule
from hotrod.runtime.fp8 import Fp8Linear
from hotrod.runtime.graphs import Graphs
from hotrod.runtime.pool import CachePool, batch_bucket

SPAN = "total_sequence_length"
# `Precision.engine_linears` -> the layer a linear is quantized into (its scales measured on the fp32 weights)
QUANTIZERS = {precisions.INT8_PER_CHANNEL: Int8Linear.quantize, precisions.FP8_PER_CHANNEL: Fp8Linear.quantize}


@dataclass(frozen=True)
class EngineOptions:
    """How the static engine runs: on which device, in which precision, recorded and compiled or not."""

    device: str = "cuda"
    precision: str = "bf16"
    keep_fp32: tuple[str, ...] = ()  # module names run in fp32 inside an fp16 model (measured)
    graphs: int = 32  # recorded calls kept (CUDA graphs on a GPU); 0: every call eager
    compile: bool = False  # torch.compile each graph before recording it
    # Encoder batches with padding run on their real tokens only (models/packing.py) when True. Off by
    # default: on a GPU the nested-tensor attention it goes through is host-bound and is never recorded
    # (padded and replayed batches are far faster; benchmarks/README.md has the figures), and on a CPU
    # torch's fallback loops over rows.
    packed: bool | None = None

    def __post_init__(self):
        engine = precisions.names(lambda p: p.engine)
        if self.precision not in engine:
            raise HotrodError(f"unknown engine precision {self.precision!r}; choose from {', '.join(engine)}")
        if self.graphs < 0:
            raise HotrodError(f"graphs must be >= 0, got {self.graphs}")

    @property
    def spec(self) -> precisions.Precision:
        """The precision's registry entry: what the engine casts to, quantizes and keeps in fp32."""
        return precisions.get(self.precision)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the precision's `torch_dtype`: int8-weight and fp8 compute in bf16)."""
        return getattr(torch, self.spec.torch_dtype)


@dataclass
class _Prepared:
    """A call's rows and arguments (`StaticBackend._prepare`): whether it is recorded, the input names fed
    (the static span aside), the outputs written in place (`targets`), the arguments (inputs, then targets),
    which of them are copied into placeholders, and the static span."""

    rows: int
    recorded: bool
    names: list[str]
    targets: list[str]
    args: list[torch.Tensor]
    copied: list[bool]
    span: int | None


class StaticBackend:
    """A `hotrod.runtime.base.Backend` over the lean module (see the module doc)."""

    def __init__(self, module: torch.nn.Module, contracts: dict[str, GraphIO], options: EngineOptions,
                 prepared: bool = False):
        """`module` in fp32, or already in the options' precision when `prepared` (read from an engine
        artifact, `hotrod.build.static_engine`)."""
        self.contracts, self.options = contracts, options
        self.torch_device = torch.device(options.device)
        self.device = self.torch_device.type
        refusal = options.spec.engine_refusal(self.device)
        if refusal:
            raise HotrodError(refusal)
        self.loop_threads = None
        self.verifies_drafts = self.verifies_batches = self.binds_outputs = False
        self.pools_cache = True
        self.chains_steps = True
        self.shares_sources = False
        # one padded, recorded call on a GPU (see `Backend`); on a CPU it runs eagerly, as onnxruntime does
        self.call_overhead_tokens = 1 << 30 if self.device == "cuda" else CALL_OVERHEAD_TOKENS
        self.dtype = options.dtype
        self.module = (module if prepared else prepare(module, options)).to(self.torch_device)
        freeze_projections(self.module)
        fewer_kernels(self.module, self.dtype)
        graphs = self.module.graphs()
        if options.compile:
            graphs = {name: torch.compile(g, dynamic=False) for name, g in graphs.items()}
        self.callables = graphs
        packed = getattr(self.module, "packed_graphs", None)
        wanted = bool(options.packed)
        self.packed = packed() if wanted and packed is not None else {}
        self.pool = CachePool(self.torch_device, self.dtype)
        self.recorded = Graphs(limit=options.graphs)

    @torch.inference_mode()
    def run(self, graph: str, feeds: Mapping[str, Any], into: Mapping[str, Any] | None = None,
            held: Held | None = None) -> dict[str, Any]:
        feeds, into = merged(feeds, into, held)
        io = contract_of(self.contracts, graph, feeds)
        if graph in self.packed and _has_padding(feeds):
            return self._run_packed(graph, io, feeds)
        into = dict(into or {})
        call = self._prepare(io, feeds, into)
        fn = self._call(graph, io, call.names, call.span, call.targets)
        outputs = iter(self._execute((graph, call.span), fn, call))
        return {n: into[n] if n in into else next(outputs)[:call.rows] for n in io.output_names}

    @torch.inference_mode()
    def chain(self, graph: str, tokens: torch.Tensor, token: str, plans: list[Mapping[str, Any]],
              held: Held | None, pick: Any) -> torch.Tensor:
        """`len(plans)` greedy steps of `graph` in one call, recorded as one graph: step j runs on the feeds
        of `plans[j]` (each row's position and length, known ahead), its `token` feed the choice `pick`
        made from the logits of the step before (the first step's: `tokens` [rows]); see `Backend.chain`.
        Returns each step's choice [rows, steps]. On a GPU the host then launches a few steps at a time
        (`hotrod.generation.device_loop`)."""
        steps = len(plans)
        first = {**plans[0], token: tokens[:, None]}
        feeds, into = merged(first, None, held)
        io = contract_of(self.contracts, graph, feeds)
        into = dict(into or {})
        call = self._prepare(io, feeds, into, plans)
        step = self._call(graph, io, call.names, call.span, call.targets)
        at = [n for n in io.output_names if n not in call.targets].index("logits")
        ahead = frozenset(i for i, n in enumerate(call.names) if n in plans[0])  # fed [steps, rows, ...]
        count, where = len(call.names), call.names.index(token)
        extra = len(call.args) - count  # the outputs written in place; what the pick reads after them
        call.args += [*pick.bound, *(self._device(t) for t in pick.tensors)]
        call.copied += [False] * len(pick.bound) + [True] * len(pick.tensors)

        def fn(*args):
            current, chosen = args[where], []
            targets, picks = args[count:count + extra], args[count + extra:]
            for j in range(steps):
                step_args = [a[j] if i in ahead else a for i, a in enumerate(args[:count])]
                step_args[where] = current
                current = pick(step(*step_args, *targets)[at][:, -1], j, *picks)[:, None]
                chosen.append(current)
            return [torch.cat(chosen, dim=1)]

        return self._execute(("chain", graph, steps, call.span, pick.key), fn, call)[0][:call.rows]

    def _prepare(self, io: GraphIO, feeds: Mapping[str, Any], into: dict[str, Any],
                 plans: list[Mapping[str, Any]] | None = None) -> _Prepared:
        """A call's arguments: every cache tensor lent by the pool at the batch bucket's rows binds the
        bases where they lie (recorded by key, the other feeds padded to the bucket); otherwise the rows
        given, on the tensors given, eagerly. A feed that `plans` hold (a chain's steps') is fed for every
        step at once, [steps, rows, ...]: one copy to the device."""
        rows = next(feeds[t.name].shape[0] for t in io.inputs if t.name != SPAN)
        lent = {name: (value, self.pool.base_of(value)) for name, value in (*feeds.items(), *into.items())
                if isinstance(value, torch.Tensor) and value.dim() == 4}
        bucket = batch_bucket(rows)
        recorded = all(base is not None and base.shape[0] == bucket for _, base in lent.values())
        bound = {name: base if recorded else value for name, (value, base) in lent.items()}
        names = [n for n in io.input_names if n != SPAN]
        targets = [n for n in io.output_names if n in into]
        width = bucket if recorded else rows

        def fed(name: str) -> torch.Tensor:
            if plans is not None and name in plans[0]:
                return self._device(_stacked([plan[name] for plan in plans], width))
            return self._device(feeds[name], width)

        args = [bound[n] if n in bound else fed(n) for n in names]
        args += [bound.get(n, into[n]) for n in targets]
        copied = [n not in bound for n in names] + [False] * len(targets)
        return _Prepared(rows, recorded, names, targets, args, copied, self._span(io, feeds, args, names))

    def _execute(self, name: tuple, fn, call: _Prepared) -> list[torch.Tensor]:
        """fn(*args), replayed from its recording where the call binds the pool's bases (see `run`)."""
        if not call.recorded:
            self.recorded.stats.eager += 1
            return list(fn(*call.args))
        key = (*name, *((tuple(a.shape), a.dtype, None if c else a.data_ptr()) for a, c in zip(call.args, call.copied)))
        return self.recorded.call(key, fn, call.args, call.copied)

    def _run_packed(self, graph: str, io: GraphIO, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Eagerly: the packed tensor's size is the batch's token count, a new shape almost every call."""
        self.recorded.stats.eager += 1
        result = self.packed[graph](*[self._device(feeds[n]) for n in io.input_names])
        result = (result,) if isinstance(result, torch.Tensor) else result
        return dict(zip(io.output_names, result))

    def _call(self, graph: str, io: GraphIO, names: list[str], span: int | None, targets: list[str]):
        """fn(*inputs, *targets) -> the outputs not in `targets`; targets are written in place."""
        module, order = self.callables[graph], io.input_names
        count = len(names)

        def fn(*args):
            values = dict(zip(names, args[:count]))
            if span is not None:
                values[SPAN] = span
            result = module(*[values[n] for n in order])
            result = (result,) if isinstance(result, torch.Tensor) else result
            out = []
            for name, value in zip(io.output_names, result):
                if name in targets:
                    target = args[count + targets.index(name)]
                    if value is not target:
                        target.copy_(value)
                else:
                    out.append(value)
            return out

        return fn

    @staticmethod
    def _span(io: GraphIO, feeds, args, names) -> int | None:
        """The static span: a prompt's width, or a step's whole cache capacity (see the module doc)."""
        if SPAN not in io.input_names:
            return None
        width = feeds[io.input_names[0]].shape[1]
        if width > 1:
            return int(width)
        cache = next(a for n, a in zip(names, args) if a.dim() == 4)
        return int(cache.shape[2])

    def _device(self, value: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        value = torch.as_tensor(value)
        if value.is_floating_point():
            value = value.to(self.dtype)
        value = value.to(self.torch_device, non_blocking=True)
        if rows is None or value.dim() == 0 or value.shape[0] == rows:
            return value
        padded = value.new_zeros((rows, *value.shape[1:]))
        padded[: value.shape[0]] = value
        return padded

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        return self.pool.take(shape)

    def to_torch(self, value: torch.Tensor) -> torch.Tensor:
        return value.float() if value.is_floating_point() else value

    def view(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def select(self, value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` into a pooled buffer, so a reordered cache still replays recorded graphs."""
        out = self.pool.take((len(index), *value.shape[1:]))
        torch.index_select(value, 0, index.to(value.device), out=out)
        return out


def _stacked(values: list[Any], rows: int) -> torch.Tensor:
    """Small host feeds of several steps as one [steps, rows, ...] tensor, each zero-padded to `rows`."""
    arrays = [np.asarray(v) for v in values]
    out = np.zeros((len(arrays), rows, *arrays[0].shape[1:]), dtype=arrays[0].dtype)
    for j, array in enumerate(arrays):
        out[j, : array.shape[0]] = array
    return torch.from_numpy(out)


def _has_padding(feeds: Mapping[str, Any]) -> bool:
    """Whether a batch has padded positions, read from its mask where it was made (on the host)."""
    mask = feeds.get("attention_mask")
    return mask is not None and not bool(torch.as_tensor(mask).all())


def prepare(module: torch.nn.Module, options: EngineOptions) -> torch.nn.Module:
    """`module` in the engine's precision: cast, fp32 islands kept, linears quantized where the precision
    stores them its own way (int8-weight, fp8: their scales measured on the fp32 weights, before the cast)."""
    module = module.eval()
    linears = options.spec.engine_linears
    if linears != precisions.CAST:
        quantize_linears(module, options.dtype, make=QUANTIZERS[linears])
    return cast_module(module, options.dtype, options.keep_fp32)


def fewer_kernels(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """The same layers in fewer kernels, once the weights are in place: a small model's step on a GPU
    costs about one launch gap per kernel, whatever the kernel computes. A layer that knows a faster way
    of its own has a `fewer_kernels(dtype)` method (GPT-2's Conv1D adds its bias in the product; T5's
    RMS norm fuses in half precision); in half precision the tanh-approximated GELU (gelu_new: eight
    elementwise kernels) becomes torch's one fused kernel of the same formula, not bit-equal to it, which
    fp32 keeps for its token identity with transformers."""
    for name, child in list(module.named_modules()):
        if hasattr(child, "fewer_kernels"):
            child.fewer_kernels(dtype)
        elif isinstance(child, NewGELUActivation) and dtype != torch.float32:
            replace_submodule(module, name, torch.nn.GELU(approximate="tanh"))


def freeze_projections(module: torch.nn.Module) -> None:
    """Fix every fused projection's weights (see `FusedProjection.freeze`), once they are on the device."""
    for child in module.modules():
        for value in vars(child).values():
            if isinstance(value, FusedProjection):
                value.freeze()
