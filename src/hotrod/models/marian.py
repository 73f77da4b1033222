"""Marian (Helsinki-NLP/opus-mt-*): sinusoidal positions read at the position itself (a table transformers
computes, never saved), embeddings times sqrt(d_model), post-norm layers with no embedding or final
LayerNorm, `final_logits_bias`, swish feed-forward in the OPUS models (`hotrod.models.bart_stack`).

With `share_encoder_decoder_embeddings` off the decoder keeps embeddings of its own, and the LM head ties
to them; hotrod runs those checkpoints where both vocabularies are the same size (the models' one token
range)."""

from __future__ import annotations

from functools import partial

from hotrod.errors import HotrodError
from hotrod.models.bart_positions import SinusoidalPositions
from hotrod.models.bart_stack import BartLikeModel, Layout, bart_dims, target_vocab
from hotrod.registry import Dims, Family, register


def sinusoidal_positions(config, dim: int) -> SinusoidalPositions:
    return SinusoidalPositions(config.max_position_embeddings, dim)


def marian_dims(config) -> Dims:
    if target_vocab(config) != config.vocab_size:
        raise HotrodError(f"this Marian checkpoint's decoder vocabulary ({target_vocab(config)} tokens) differs from "
                          f"its encoder's ({config.vocab_size}); hotrod runs Marian models with one size for both")
    return bart_dims(config)


LAYOUT = Layout(positions=sinusoidal_positions, pre_norm=False, embedding_norm=False, logits_bias=True)

FAMILY = register(Family(name="marian", model_types=("marian",), kind="seq2seq", sizes=marian_dims,
                         build=partial(BartLikeModel, layout=LAYOUT), onnx_optimizer="bart"))
