"""Weight precision for the static engine: cast once, keep fragile modules in fp32 by measurement.

bf16 has fp32's range and never overflows; fp16 has three more mantissa bits but tops out at 65504,
and T5 checkpoints are known to pass that inside their feed-forward blocks. Which modules overflow is
measured, not guessed: `overflowing_modules` runs the fp32 model on sample inputs and records every
module's inputs and outputs; a module whose values leave fp16's range is kept in fp32 together with
its enclosing modules up to the first one whose own inputs and outputs fit, so the fp32 island has
fp16-safe edges. Its inputs are cast up and its outputs back down at those edges (`keep_float32`).

Weight-only int8 stores each linear weight as int8 with one fp scale per output channel: a batch-1
decode step reads every weight once per token, so halving the bytes read is the lever there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from hotrod.errors import HotrodError

# Values past a quarter of fp16's range count as overflowing: sample inputs are a sample, and unseen
# inputs run larger.
FP16_LIMIT = torch.finfo(torch.float16).max / 4


def overflowing_modules(module: nn.Module, run: Callable[[], object], limit: float = FP16_LIMIT) -> list[str]:
    """Names of the smallest modules to keep in fp32 so that fp16 holds every value outside them.

    `run` calls `module` (in fp32) on sample inputs. Raises HotrodError when even the whole model's
    edges overflow (then no fp16 model can hold it: use bf16).
    """
    peaks: dict[str, torch.Tensor] = {}  # each module's largest input or output value, kept on its device
    handles = [m.register_forward_hook(_recorder(name, peaks)) for name, m in module.named_modules()]
    try:
        with torch.inference_mode():
            run()
    finally:
        for handle in handles:
            handle.remove()
    edges = {name: float(peak) for name, peak in peaks.items()}  # read back once, not once a module a call
    keep: set[str] = set()
    for name in (n for n, peak in edges.items() if peak > limit):
        island = _fitting_ancestor(name, edges, limit)
        if island is None:
            raise HotrodError(f"fp16 cannot hold this model: values reach {edges[name]:.3g} at the model's own "
                              "inputs or outputs; use bf16")
        keep.add(island)
    return sorted(k for k in keep if not any(k.startswith(other + ".") for other in keep))


def _recorder(name: str, peaks: dict[str, torch.Tensor]):
    def hook(module, inputs, output):
        seen = [t for t in (*inputs, *_tensors(output))
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
        if not seen:
            peaks.setdefault(name, torch.zeros(()))
            return
        peak = torch.stack([t.detach().abs().amax().float() for t in seen]).amax()
        peaks[name] = torch.maximum(peaks[name].to(peak.device), peak) if name in peaks else peak

    return hook


def _tensors(output) -> Iterable:
    return output if isinstance(output, (tuple, list)) else (output,)


def _fitting_ancestor(name: str, edges: dict[str, float], limit: float) -> str | None:
    """`name`'s first ancestor (a parent, its parent, ...) whose inputs and outputs stay within `limit`."""
    parts = name.split(".") if name else []
    while parts:
        parts = parts[:-1]
        candidate = ".".join(parts)
        if candidate and edges.get(candidate, limit + 1) <= limit:
            return candidate
    return None


def cast_module(module: nn.Module, dtype: torch.dtype, keep: Iterable[str] = ()) -> nn.Module:
    """`module` in `dtype`, but for the submodules named in `keep`, which keep their fp32 weights (cast
    from the originals, not back from `dtype`: a weight rounded to fp16 once stays rounded)."""
    islands = {}
    for name in keep:
        try:
            islands[name] = {k: v.detach().float().clone() for k, v in module.get_submodule(name).state_dict().items()}
        except AttributeError:
            raise HotrodError(f"keep_fp32 names {name!r}, which this model does not have") from None
    module = module.to(dtype)
    for name, state in islands.items():
        island = module.get_submodule(name)
        keep_float32(island)
        island.load_state_dict(state)
    return module


def keep_float32(module: nn.Module) -> None:
    """Run `module` in fp32 inside a half-precision model: inputs cast up, outputs cast back down
    (clamped to the half type's finite range, as transformers' fp16 T5 clamps its hidden states)."""
    module.float()
    state: dict[str, torch.dtype] = {}

    def up(_, args):
        floats = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        state["dtype"] = floats[0] if floats else torch.float32
        return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    def down(_, args, output):
        dtype = state.get("dtype", torch.float32)
        if dtype == torch.float32:
            return output
        bound = torch.finfo(dtype).max
        cast = [o.clamp(-bound, bound).to(dtype) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                for o in _tensors(output)]
        return cast[0] if isinstance(output, torch.Tensor) else type(output)(cast)

    module.register_forward_pre_hook(up)
    module.register_forward_hook(down)


class Int8Linear(nn.Module):
    """A linear layer with int8 weights and one scale per output channel (weight-only quantization).

    The weight is widened to the activation's dtype inside the matmul's kernel once compiled (inductor
    fuses the conversion into the GEMM), so only int8 bytes are read from memory.
    """

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    @classmethod
    def quantize(cls, linear: nn.Linear, dtype: torch.dtype) -> Int8Linear:
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(q, scales.to(dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.linear(x, self.weight.to(x.dtype)) * self.scales
        return out if self.bias is None else out + self.bias


def replace_submodule(module: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` where `module`'s submodule called `name` (a dotted path) was."""
    parent, _, attr = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, attr, new)


def quantize_linears(module: nn.Module, dtype: torch.dtype, skip: Iterable[str] = (),
                     make: Callable[[nn.Linear, torch.dtype], nn.Module | None] | None = None) -> list[str]:
    """Replace every linear layer (an nn.Linear, or a layer that gives one by `as_linear`, such as GPT-2's
    Conv1D) outside `skip` prefixes by `make(linear, dtype)` (an Int8Linear when not given; a layer `make`
    returns None for stays as it is); returns the names replaced."""
    from hotrod.models.common import FusedProjection

    make = make or Int8Linear.quantize
    skipped = tuple(skip)
    swapped: dict[int, nn.Module] = {}
    for name, child in list(module.named_modules()):
        if any(name == s or name.startswith(s + ".") for s in skipped):
            continue
        linear = child if isinstance(child, nn.Linear) else child.as_linear() if hasattr(child, "as_linear") else None
        layer = None if linear is None else make(linear, dtype)
        if layer is not None:
            swapped[id(child)] = layer
            replace_submodule(module, name, layer)
    for child in module.modules():  # fused projections hold their layers: point them at the new ones
        for value in vars(child).values():
            if isinstance(value, FusedProjection):
                value.layers = tuple(swapped.get(id(layer), layer) for layer in value.layers)
    made = {id(layer) for layer in swapped.values()}
    return sorted(name for name, child in module.named_modules() if id(child) in made)
