"""Building blocks shared by the lean family modules.

Everything here is written for inference and for a clean ONNX trace: explicit tensors in and out,
masks as booleans applied with one `masked_fill` (so that a fully masked row, such as a left-pad
query, yields a uniform softmax instead of NaN), no Python branches on tensor values.
"""

from __future__ import annotations

import torch
from torch import nn

from hotrod.errors import HotrodError


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, S, H*D] -> [B, H, S, D]"""
    batch, seq, width = x.shape
    return x.view(batch, seq, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> [B, S, H*D]"""
    batch, heads, seq, dim = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * dim)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float = 1.0,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager scaled dot-product attention; `allowed` is a bool mask broadcastable to [B, H, Sq, Sk]."""
    scores = torch.matmul(q, k.transpose(-1, -2))
    if scale != 1.0:
        scores = scores * scale
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, Sk] 0/1 -> bool [B, 1, 1, Sk]: which keys may be attended to."""
    return attention_mask.bool()[:, None, None, :]


def causal_mask(query_len: torch.Tensor | int, key_len: torch.Tensor | int, device=None) -> torch.Tensor:
    """bool [1, 1, Sq, Sk]: query i (absolute position Sk - Sq + i) sees keys up to itself."""
    q_pos = torch.arange(query_len, device=device)[:, None] + (key_len - query_len)
    k_pos = torch.arange(key_len, device=device)[None, :]
    return (k_pos <= q_pos)[None, None]


class Conv1D(nn.Module):
    """GPT-2's transposed linear layer (weight [in, out]), kept as is so checkpoints load unchanged."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


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
