"""The three graphs every encoder-decoder family exports (`hotrod.contracts.seq2seq_io`), over a lean model
that has `encode`, `cross_kv`, `decode` and `decode_step` (T5's, the BART-like families'), and the
cross-attention bias they share.

The step reads one cross K/V and encoder mask per source, its rows (a source's beams or samples, side by
side) folded onto the query axis of one attention over them (`hotrod.models.attention.cross_attention`).

The encoder; the first decoder step, which also returns each layer's cross-attention K/V (computed once
from the encoder output); and the decoder step with past, which reuses them and writes its self-attention
K/V into the cache buffers in place.
"""

from __future__ import annotations

import torch
from torch import nn

from hotrod.models.attention import additive_mask, folded_width, padding_mask


def cross_bias(encoder_mask, input_ids, dtype) -> torch.Tensor:
    """[S, 1, g * Sq, Sk]: 0 where a query may read an encoder position, the dtype's minimum where it may not,
    for `input_ids` [R, Sq] (g rows per source) folded onto their sources' query axis (`cross_attention`),
    that axis spelled out (ONNX Runtime's MultiHeadAttention broadcasts no bias over it). Exported, the same
    values in the form with the fewest nodes: every decoding step computes it, and expand's shape arithmetic
    and masked_fill's take 17 nodes where these take 9."""
    query_len = folded_width(input_ids, encoder_mask)
    if torch.onnx.is_in_onnx_export():
        keys = (encoder_mask == 0).to(dtype)[:, None, None, :] * torch.finfo(dtype).min
        return keys + torch.zeros(1, 1, query_len, 1, dtype=dtype, device=encoder_mask.device)
    allowed = padding_mask(encoder_mask).expand(-1, -1, query_len, -1)
    return additive_mask(allowed, dtype)


def seq2seq_graphs(model: nn.Module) -> dict[str, nn.Module]:
    """The graphs of the seq2seq contract, by name."""
    return {"encoder": EncoderGraph(model), "decoder_init": DecoderInit(model), "decoder": DecoderStep(model)}


class EncoderGraph(nn.Module):
    """(input_ids, attention_mask) -> encoder_hidden_states"""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model.encode(input_ids, attention_mask)


class DecoderInit(nn.Module):
    """(decoder_input_ids, encoder_attention_mask, encoder_hidden_states) -> (logits, *present, *cross)"""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids, encoder_attention_mask, encoder_hidden_states):
        cross = self.model.cross_kv(encoder_hidden_states)
        logits, present = self.model.decode(decoder_input_ids, encoder_attention_mask, cross)
        return (logits, *present, *[t for kv in cross for t in kv])


class DecoderStep(nn.Module):
    """(decoder_input_ids, seqlens_k, total_sequence_length, encoder_attention_mask, *cache, *cross)
    -> (logits, *cache): the cache buffers are written in place (`hotrod.contracts.seq2seq_io`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids, seqlens_k, total_sequence_length, encoder_attention_mask, *caches):
        layers = len(caches) // 4  # each layer's self K and V, then each layer's cross K and V
        pairs = [(caches[2 * i], caches[2 * i + 1]) for i in range(2 * layers)]
        logits, present = self.model.decode_step(decoder_input_ids, encoder_attention_mask, pairs[:layers],
                                                 pairs[layers:], seqlens_k, total_sequence_length)
        return (logits, *present)
