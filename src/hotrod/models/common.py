"""Building blocks shared by the lean family modules.

Everything here is written for inference and for a clean ONNX trace: explicit tensors in and out,
no Python branches on tensor values. Attention runs eagerly in PyTorch and exports as one ONNX Runtime
attention node (com.microsoft), so the graphs carry no per-layer reshape/transpose chains:

- `MultiHeadAttention` for attention over inputs alone (encoders, T5's first decoder step, cross
  attention). Masks are additive (0 or the dtype's minimum), the form that op takes; a fully masked row
  (a padded query) gets a uniform softmax instead of NaN.
- `GroupQueryAttention` for decoder steps: it writes the new keys and values into a preallocated cache
  buffer in place, at each row's own length (`seqlens_k`), and reads each row only up to that length.
  A step then reads the cache once, where appending reads it, writes a copy and reads it again; rows of
  different lengths share a batch without padding.

Rotary position embeddings export the same way, as one `RotaryEmbedding` node over a [B, S, H*D]
projection, in place of each query's and key's reshape / slice / negate / concatenate chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hotrod.errors import HotrodError
from hotrod.registry import Dims

FUSED_ATTENTION_DOMAIN = "com.microsoft"


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, S, H*D] -> [B, H, S, D]"""
    batch, seq, width = x.shape
    return x.view(batch, seq, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> [B, S, H*D]"""
    batch, heads, seq, dim = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * dim)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """bool -> 0 where attention is allowed, the dtype's minimum where it is not."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _eager_attention(q, k, v, bias, num_heads: int, scale: float) -> torch.Tensor:
    """q [B, Sq, H*D]; k, v [B, H, Sk, D]; bias additive, broadcastable to [B, H, Sq, Sk].

    fp32 on the CPU keeps the plain matmul-softmax-matmul, whose sums match transformers' eager
    attention bit for bit; elsewhere (a GPU, half precision) `scaled_dot_product_attention` picks its
    fused kernels (flash, memory-efficient), which never write the score matrix to memory.
    """
    if q.is_cuda or q.dtype != torch.float32:
        out = torch.nn.functional.scaled_dot_product_attention(
            split_heads(q, num_heads), k, v, attn_mask=bias.to(q.dtype), scale=scale)
        return merge_heads(out)
    scores = torch.matmul(split_heads(q, num_heads), k.transpose(-1, -2)) * scale + bias
    return merge_heads(torch.matmul(torch.softmax(scores, dim=-1), v))


def _heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    return x if x.dim() == 4 else split_heads(x, num_heads)


def _is_none(value) -> bool:
    node = getattr(value, "node", lambda: None)()
    return node is not None and node.mustBeNone()


def _none(g):
    from torch.onnx import symbolic_helper

    return symbolic_helper._optional_input_placeholder_tensor(g)


class _Attention(torch.autograd.Function):
    """Attention without a cache; key/value are [B, Sk, H*D] projections or [B, H, Sk, D] (cross K/V)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, num_heads: int, scale: float):
        return _eager_attention(q, _heads(k, num_heads), _heads(v, num_heads), bias, num_heads, scale)

    @staticmethod
    def symbolic(g, q, k, v, bias, num_heads: int, scale: float):
        out = g.op(f"{FUSED_ATTENTION_DOMAIN}::MultiHeadAttention", q, k, v, _none(g), _none(g), bias,
                   num_heads_i=num_heads, scale_f=scale)
        out.setType(q.type())
        return out


class _GroupQueryAttention(torch.autograd.Function):
    """Causal attention over a shared cache buffer [B, H, M, D], updated in place (see the module doc).

    As the ONNX Runtime op: when `total_len` equals the query length this is a first prompt (row b's
    tokens at positions 0..seqlens_k[b], right-padded to the query length); otherwise the new tokens
    follow the row's past, at positions seqlens_k[b] + 1 - Sq .. seqlens_k[b]. `bias` (or None) is
    added to the scores: [B or 1, H or 1, Sq or 1, total_len] (T5's relative positions).
    """

    @staticmethod
    def forward(ctx, q, k, v, past_k, past_v, seqlens_k, total_len, bias, num_heads: int, scale: float):
        batch, width = q.shape[0], q.shape[1]
        ends = seqlens_k.long() + 1  # each row's length after this call
        starts = torch.zeros_like(ends) if int(total_len) == width else ends - width
        positions = starts[:, None] + torch.arange(width, device=q.device)  # [B, Sq]
        rows = torch.arange(batch, device=q.device)[:, None]
        fits = positions < past_k.shape[2]  # a right-pad query beyond the buffer writes nowhere
        for cache, new in ((past_k, k), (past_v, v)):
            cache[rows.expand_as(positions)[fits], :, positions[fits]] = new.view(batch, width, num_heads, -1)[fits]
        out = _over_cache(q, past_k, past_v, positions, ends, int(ends.max()), bias, num_heads, scale)
        return out, past_k, past_v

    @staticmethod
    def symbolic(g, q, k, v, past_k, past_v, seqlens_k, total_len, bias, num_heads: int, scale: float):
        extra = () if bias is None or _is_none(bias) else (_none(g), _none(g), _none(g), bias)
        out, present_k, present_v = g.op(
            f"{FUSED_ATTENTION_DOMAIN}::GroupQueryAttention", q, k, v, past_k, past_v, seqlens_k, total_len, *extra,
            num_heads_i=num_heads, kv_num_heads_i=num_heads, scale_f=scale, outputs=3,
        )
        out.setType(q.type())
        present_k.setType(past_k.type())
        present_v.setType(past_v.type())
        return out, present_k, present_v


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


def multi_head_attention(q, k, v, bias, num_heads: int, scale: float) -> torch.Tensor:
    """Fused attention: q [B, Sq, H*D]; k, v [B, Sk, H*D] or [B, H, Sk, D]; returns [B, Sq, H*D]."""
    return _Attention.apply(q, k, v, bias, num_heads, float(scale))


def rotary_tables(positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, D/2] of the angles p * theta^(-2i/D), in fp32 as transformers computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Each head's halves (a, b) at position p become (a cos - b sin, b cos + a sin), in fp32."""
    batch, seq, width = x.shape
    heads = x.view(batch, seq, num_heads, width // num_heads).float()
    cos, sin = (torch.cat((t[:seq], t[:seq]), dim=-1)[:, None, :].float() for t in (cos, sin))
    first, second = heads.chunk(2, dim=-1)
    return (heads * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype).reshape(batch, seq, width)


class _RotaryEmbedding(torch.autograd.Function):
    """Rotary embeddings of x [B, S, H*D] at positions 0 .. S-1 from the tables [P, D/2] (rotate-half layout)."""

    @staticmethod
    def forward(ctx, x, cos, sin, num_heads: int):
        return _rotate(x, cos, sin, num_heads)

    @staticmethod
    def symbolic(g, x, cos, sin, num_heads: int):
        start = g.op("Constant", value_t=torch.zeros(1, dtype=torch.long))  # positions from 0
        out = g.op(f"{FUSED_ATTENTION_DOMAIN}::RotaryEmbedding", x, start, cos, sin, num_heads_i=num_heads,
                   interleaved_i=0)
        out.setType(x.type())
        return out


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings of the tokens at positions 0 .. S-1 of each row, for at most `positions`
    positions; the tables are buffers, cast with the model (transformers casts its tables to the
    activations' dtype too) and never read from a checkpoint."""

    def __init__(self, head_dim: int, theta: float, positions: int):
        super().__init__()
        cos, sin = rotary_tables(positions, head_dim, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        """x [B, S, H*D] -> the same, each head turned by its position's angles."""
        return _RotaryEmbedding.apply(x, self.cos, self.sin, num_heads)


class _KeyPositions(torch.autograd.Function):
    """0 .. total_len - 1 for a 0-d integer tensor `total_len`, exported as a Range on that tensor
    (tracing torch.arange would freeze the length seen at export time)."""

    @staticmethod
    def forward(ctx, total_len):
        return torch.arange(int(total_len), device=total_len.device)

    @staticmethod
    def symbolic(g, total_len):
        from onnx import TensorProto

        end = g.op("Cast", total_len, to_i=TensorProto.INT64)
        start = g.op("Constant", value_t=torch.tensor(0, dtype=torch.long))
        delta = g.op("Constant", value_t=torch.tensor(1, dtype=torch.long))
        return g.op("Range", start, end, delta)


def key_positions(total_len: torch.Tensor | int, device=None) -> torch.Tensor:
    """[total_len]: the positions an in-place cache holds after a call (see `attention_in_place`); a
    Python int is a static span."""
    if isinstance(total_len, int):
        return torch.arange(total_len, device=device)
    return _KeyPositions.apply(total_len)


def attention_in_place(q, k, v, past_k, past_v, seqlens_k, total_len, num_heads: int, scale: float, bias=None,
                       shared: StaticSpan | None = None):
    """Causal attention that writes k, v ([B, Sq, H*D]) into the cache buffers at each row's length;
    returns (out, past_k, past_v), the buffers being the ones passed in, updated.

    `total_len` as a tensor is the ONNX Runtime op's input: the span read is the longest row, found on
    the host. As a Python int it is a static span (the buffer's capacity for a step, the prompt width
    for a prefill): every shape is then fixed and no value leaves the device, so the call can be
    captured in a CUDA graph and replayed (`hotrod.runtime.static`). There `shared` (`static_span`,
    made once a forward by the model) holds what every layer's call has in common; without it each
    layer makes its own.
    """
    if isinstance(total_len, int):
        shared = shared or static_span(seqlens_k, total_len, q.shape[1], q.dtype, bias)
        return static_attention_in_place(q, k, v, past_k, past_v, shared, num_heads, float(scale))
    return _GroupQueryAttention.apply(q, k, v, past_k, past_v, seqlens_k, total_len, bias, num_heads, float(scale))


@dataclass(frozen=True)
class StaticSpan:
    """What every layer's static in-place attention shares within one call: where each row writes and
    the additive mask (with T5's position bias folded in). Made once a forward, not once a layer: per
    layer, its casts, ranges and comparisons were a dozen small kernels each, a large part of a small
    model's decoding step on a GPU, where every kernel costs its launch however little it computes."""

    span: int
    width: int
    seqlens: torch.Tensor  # [B] int64: each row's position of its one new token (a step)
    rows: torch.Tensor  # [B] int64: 0..B-1
    bias: torch.Tensor  # additive, [B, 1 or H, Sq, span], in the activations' dtype


def static_span(seqlens_k: torch.Tensor, span: int, width: int, dtype: torch.dtype, bias=None) -> StaticSpan:
    """The `StaticSpan` of a call with queries `width` wide: a prompt as wide as `span` (rows from
    position 0, right-padded; the buffer holds at least `span` positions), or a one-token step at each
    row's own position `seqlens_k[b]`. The keys read are the first `span` positions, masked per row."""
    batch = seqlens_k.shape[0]
    seqlens = seqlens_k.long()
    ends = seqlens + 1
    if width == span:  # a prompt: every row from position 0
        positions = torch.arange(width, device=seqlens.device)[None, :].expand(batch, width)
    elif width == 1:
        positions = seqlens[:, None]
    else:
        raise ValueError(f"a static in-place call takes a prompt of width {span} or one token, got {width}")
    return StaticSpan(span, width, seqlens, torch.arange(batch, device=seqlens.device),
                      _cache_mask(positions, ends, span, dtype, bias))


def layers_span(seqlens_k: torch.Tensor, total_len, width: int, dtype: torch.dtype, bias=None) -> StaticSpan | None:
    """`static_span` for a model's forward to hand every layer, where `total_len` is a static span (a Python
    int); None where it is the ONNX Runtime op's tensor input (the export), whose op does its own."""
    return static_span(seqlens_k, total_len, width, dtype, bias) if isinstance(total_len, int) else None


def static_attention_in_place(q, k, v, past_k, past_v, shared: StaticSpan, num_heads: int, scale: float):
    """`attention_in_place` with fixed shapes (see `static_span`)."""
    width, span = q.shape[1], shared.span
    if width != shared.width:
        raise ValueError(f"queries {width} wide in a call made for {shared.width}")
    new_k, new_v = split_heads(k, num_heads), split_heads(v, num_heads)
    if width == span:  # a prompt: every row from position 0
        past_k[:, :, :width] = new_k
        past_v[:, :, :width] = new_v
    else:  # a step: row b writes at its own position
        past_k[shared.rows, :, shared.seqlens] = new_k[:, :, 0]
        past_v[shared.rows, :, shared.seqlens] = new_v[:, :, 0]
    out = _eager_attention(q, past_k[:, :, :span], past_v[:, :, :span], shared.bias, num_heads, scale)
    return out, past_k, past_v


def _over_cache(q, past_k, past_v, positions, ends, span: int, bias, num_heads: int, scale: float) -> torch.Tensor:
    """Attention of queries at `positions` [B, Sq] over the first `span` cached keys (see `_cache_mask`)."""
    scores_bias = _cache_mask(positions, ends, span, q.dtype, bias)
    return _eager_attention(q, past_k[:, :, :span], past_v[:, :, :span], scores_bias, num_heads, scale)


def _cache_mask(positions: torch.Tensor, ends: torch.Tensor, span: int, dtype: torch.dtype, bias) -> torch.Tensor:
    """The additive scores bias [B, 1 or H, Sq, span] of queries at `positions` [B, Sq] over the first `span`
    cached keys: each query sees the keys up to itself and within its row's length `ends` [B]; `bias` (or
    None) is added to it."""
    keys = torch.arange(span, device=positions.device)
    allowed = (keys[None, None, :] <= positions[:, :, None]) & (keys[None, None, :] < ends[:, None, None])
    scores_bias = additive_mask(allowed[:, None], dtype)
    return scores_bias if bias is None else scores_bias + bias[..., :span].to(dtype)


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
