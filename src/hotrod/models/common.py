"""Layers and checkpoint helpers shared by the lean family modules: fused projections, GPT-2's Conv1D, a
gather of each row's positions that exports as one node, and weights read from a checkpoint.

Attention lives in `hotrod.models.attention`, rotary embeddings in `hotrod.models.rotary`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hotrod.errors import HotrodError
from hotrod.registry import Dims


class _RowsAt(torch.autograd.Function):
    """x [B, S, H] at positions [B, K] -> [B, K, H]."""

    @staticmethod
    def forward(ctx, x, positions):
        return torch.gather(x, 1, positions[:, :, None].expand(-1, -1, x.shape[-1]))

    @staticmethod
    def symbolic(g, x, positions):
        axes = g.op("Constant", value_t=torch.tensor([-1], dtype=torch.long))
        out = g.op("GatherND", x, g.op("Unsqueeze", positions, axes), batch_dims_i=1)
        out.setType(x.type().with_sizes([None, None, None]))
        return out


def rows_at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Each row's hidden states at its own positions: x [B, S, H], positions [B, K] -> [B, K, H]. Exported
    as one GatherND, where gather's expanded index takes a dozen shape nodes: a decoding step runs it
    to pick the positions whose logits it returns."""
    return _RowsAt.apply(x, positions)



class FusedProjection:
    """Several projections of one input (Q, K, V) as one matmul over concatenated weights.

    The concatenation is cached (rebuilt if a weight changes) and becomes one initializer on export.
    """

    def __init__(self, *layers: nn.Linear):
        self.layers = layers
        self._key: tuple | None = None
        self._fused: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def __call__(self, x: torch.Tensor) -> Sequence[torch.Tensor]:
        if not all(isinstance(layer, nn.Linear) for layer in self.layers):  # quantized layers run their own kernels
            return [layer(x) for layer in self.layers]
        return torch.nn.functional.linear(x, *self._weights()).split([layer.out_features for layer in self.layers], dim=-1)

    def freeze(self) -> None:
        """Fix the concatenation for good, the layers' weights becoming views of it (no second copy in
        memory). For an engine whose weights no longer change: no per-call check, nothing for a
        compiler to trace but the one matmul."""
        if not all(isinstance(layer, nn.Linear) for layer in self.layers):
            return
        weight, bias = self._concatenated()
        start = 0
        for layer in self.layers:
            end = start + layer.out_features
            layer.weight.data = weight[start:end]
            if bias is not None:
                layer.bias.data = bias[start:end]
            start = end
        self._fused = (weight, bias)
        self._key = None
        self._frozen = True

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if getattr(self, "_frozen", False):
            return self._fused
        params = [p for layer in self.layers for p in (layer.weight, layer.bias) if p is not None]
        key = tuple((p.data_ptr(), p._version) for p in params)
        if key != self._key:
            self._key, self._fused = key, self._concatenated()
        return self._fused

    def _concatenated(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = torch.cat([layer.weight for layer in self.layers]).detach()
        biases = [layer.bias for layer in self.layers]
        return weight, torch.cat(biases).detach() if all(b is not None for b in biases) else None


class Conv1D(nn.Module):
    """GPT-2's transposed linear layer (weight [in, out]), kept as is so checkpoints load unchanged."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        # The static engine sets it (`fewer_kernels`): one addmm, the bias added in the product's epilogue
        # (one kernel, not two), the way transformers' Conv1D computes. The export keeps MatMul + Add on the
        # 3-D input: no reshape chain in the graph, and every weight is a MatMul's, as ONNX Runtime's fusions
        # expect.
        self.fused_bias = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_bias:
            return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)
        return torch.matmul(x, self.weight) + self.bias

    def fewer_kernels(self, dtype: torch.dtype) -> None:
        """On the static engine (`hotrod.runtime.static.fewer_kernels`): the bias in the product."""
        self.fused_bias = True

    def as_linear(self) -> nn.Linear:
        """The same layer as an nn.Linear (weight [out, in]), for what rewrites linear layers (the static
        engine's weight quantization, `hotrod.runtime.cast.quantize_linears`)."""
        linear = nn.Linear(*self.weight.shape, device=self.weight.device, dtype=self.weight.dtype)
        linear.weight.data = self.weight.detach().t().contiguous()
        linear.bias.data = self.bias.detach()
        return linear


def strip_prefix(state_dict: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Drop the first head-model prefix (`transformer.`, `bert.`, ...) that the checkpoint uses."""
    for prefix in prefixes:
        if any(key.startswith(prefix) for key in state_dict):
            return {
                (key.removeprefix(prefix)): value
                for key, value in state_dict.items()
            }
    return state_dict


def load_weights(module: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors into `module`; a missing or misshapen weight is a user error, not a warning.

    Extra checkpoint tensors (a pooler, a classifier head) are ignored: hotrod serves the base model
    and the LM head.
    """
    own = module.state_dict()
    missing = [name for name in own if name not in state_dict]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise HotrodError(f"checkpoint is missing {len(missing)} weight(s): {shown}")
    for name, tensor in own.items():
        source = state_dict[name]
        if tuple(source.shape) != tuple(tensor.shape):
            raise HotrodError(
                f"checkpoint weight {name} has shape {tuple(source.shape)}, config expects {tuple(tensor.shape)}"
            )
    module.load_state_dict({name: state_dict[name].to(tensor.dtype) for name, tensor in own.items()})


def standard_dims(config, max_positions: int | None, **extra) -> Dims:
    """The sizes of a config that answers to transformers' common names (hidden_size, num_hidden_layers,
    num_attention_heads); `extra`: the family's other sizes (type_vocab_size, ...)."""
    return Dims(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        max_positions=max_positions,
        **extra,
    )
