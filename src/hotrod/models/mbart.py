"""mBART (facebook/mbart-large-cc25, mbart-large-50 and its many-to-many translators): BART's learned
positions (+ 2) and embedding LayerNorm, but pre-norm layers, with a last LayerNorm closing the encoder and
the decoder (`hotrod.models.bart_stack`). Its decoder starts from the target language's token, which
transformers forces as the first generated token (`forced_bos_token_id`, a generation setting). Its
sequence-classification head runs as BART's does (`hotrod.models.bart_classifier`), the decoder's inputs
its own shift (`wrap_last`)."""

from __future__ import annotations

from functools import partial

import torch

from hotrod.models import bart_classifier
from hotrod.models.bart import learned_positions
from hotrod.models.bart_classifier import ClassificationHead
from hotrod.models.bart_stack import Layout, bart_dims
from hotrod.registry import Family, register
from hotrod.tasks.constants import CLASSIFY


def wrap_last(input_ids: torch.Tensor, config) -> torch.Tensor:
    """transformers' `shift_tokens_right` of mBART, which has no one start token: each row's last token that
    is not padding (its language id) first, then the row shifted right."""
    last = (input_ids != config.pad_token_id).long().sum(dim=1, keepdim=True) - 1
    return torch.cat([input_ids.gather(1, last), input_ids[:, :-1]], dim=1)


LAYOUT = Layout(positions=learned_positions, pre_norm=True, embedding_norm=True, logits_bias=True,
                decoder_inputs=wrap_last)

FAMILY = register(Family(name="mbart", model_types=("mbart",), kind="seq2seq", sizes=bart_dims,
                         build=partial(bart_classifier.build, layout=LAYOUT), heads={CLASSIFY: ClassificationHead},
                         onnx_optimizer="bart"))
