"""Attention as the lean family modules run it: eager in PyTorch, one ONNX Runtime node (com.microsoft) on export.

Everything here is written for inference and for a clean ONNX trace: explicit tensors in and out,
no Python branches on tensor values, so the graphs carry no per-layer reshape/transpose chains:

- `MultiHeadAttention` for attention over inputs alone (encoders, T5's first decoder step, cross
  attention). Masks are additive (0 or the dtype's minimum), the form that op takes; a fully masked row
  (a padded query) gets a uniform softmax instead of NaN.
- `GroupQueryAttention` for decoder steps: it writes the new keys and values into a preallocated cache
  buffer in place, at each row's own length (`seqlens_k`), and reads each row only up to that length.
  A step then reads the cache once, where appending reads it, writes a copy and reads it again; rows of
  different lengths share a batch without padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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



def multi_head_attention(q, k, v, bias, num_heads: int, scale: float) -> torch.Tensor:
    """Fused attention: q [B, Sq, H*D]; k, v [B, Sk, H*D] or [B, H, Sk, D]; returns [B, Sq, H*D]."""
    return _Attention.apply(q, k, v, bias, num_heads, float(scale))


def cross_attention(q, k, v, bias, num_heads: int, scale: float) -> torch.Tensor:
    """Decoder rows over their source's cross K/V: q [R, Sq, H*D], whose R = S * g rows are g consecutive
    rows per source (its beams, or its samples); k, v [S, H, Sk, D], one copy per source; `bias` [S, 1 or H,
    g * Sq, Sk] (a source's rows side by side, `folded_width`). A source's rows ride the query axis of one
    attention over its K/V, so a step reads each source's cross K/V once, not once per beam: with 4 beams
    over a long source, those copies were most of what a step read from memory."""
    rows, width, hidden = q.shape
    out = multi_head_attention(q.reshape(k.shape[0], -1, hidden), k, v, bias, num_heads, scale)
    return out.reshape(rows, width, hidden)


def folded_width(input_ids: torch.Tensor, sources: torch.Tensor) -> int:
    """The query axis of `cross_attention` for `input_ids` [R, Sq] over `sources` [S, ...] (the encoder
    mask): g * Sq, a source's g rows side by side. Read off a reshape, which exports as shapes alone."""
    return input_ids.reshape(sources.shape[0], -1).shape[1]



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


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, Sk] 0/1 -> bool [B, 1, 1, Sk]: which keys may be attended to."""
    return attention_mask.bool()[:, None, None, :]


def causal_mask(query_len: torch.Tensor | int, key_len: torch.Tensor | int, device=None) -> torch.Tensor:
    """bool [1, 1, Sq, Sk]: query i (absolute position Sk - Sq + i) sees keys up to itself."""
    q_pos = torch.arange(query_len, device=device)[:, None] + (key_len - query_len)
    k_pos = torch.arange(key_len, device=device)[None, :]
    return (k_pos <= q_pos)[None, None]

