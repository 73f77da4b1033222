"""M2M100 and NLLB (facebook/m2m100_418M, facebook/nllb-200-distilled-600M, ...; model_type m2m_100):
fairseq's sinusoidal positions counted from the token ids (the pad token reads a zero row, the others
pad + 1 onwards), embeddings times sqrt(d_model), pre-norm layers with a last LayerNorm closing each stack,
no embedding LayerNorm and no `final_logits_bias` (`hotrod.models.bart_stack`). Its decoder starts from
EOS, and transformers forces the target language's token first (`forced_bos_token_id`, a generation
setting)."""

from __future__ import annotations

from functools import partial

from hotrod.models.bart_positions import PaddedSinusoidalPositions
from hotrod.models.bart_stack import BartLikeModel, Layout, bart_dims
from hotrod.registry import Family, register


def padded_positions(config, dim: int) -> PaddedSinusoidalPositions:
    return PaddedSinusoidalPositions(config.max_position_embeddings, dim, config.pad_token_id)


LAYOUT = Layout(positions=padded_positions, pre_norm=True, embedding_norm=False, logits_bias=False)

FAMILY = register(Family(name="m2m_100", model_types=("m2m_100",), kind="seq2seq", sizes=bart_dims,
                         build=partial(BartLikeModel, layout=LAYOUT), onnx_optimizer="bart"))
