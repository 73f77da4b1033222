"""BART (facebook/bart-base, bart-large, bart-large-cnn, distilbart): the BART-like stack
(`hotrod.models.bart_stack`) with learned positions read at position + 2, a LayerNorm over the embeddings,
post-norm layers and `final_logits_bias`; the LM head and both embeddings tied to `shared`. Its
sequence-classification head (bart-large-mnli: zero-shot) runs the whole model as one encoder-kind graph
(`hotrod.models.bart_classifier`)."""

from __future__ import annotations

from functools import partial

from hotrod.models import bart_classifier
from hotrod.models.bart_classifier import ClassificationHead
from hotrod.models.bart_positions import LearnedPositions
from hotrod.models.bart_stack import Layout, bart_dims
from hotrod.registry import Family, register
from hotrod.tasks.constants import CLASSIFY


def learned_positions(config, dim: int) -> LearnedPositions:
    return LearnedPositions(config.max_position_embeddings, dim)


LAYOUT = Layout(positions=learned_positions, pre_norm=False, embedding_norm=True, logits_bias=True)

FAMILY = register(Family(name="bart", model_types=("bart",), kind="seq2seq", sizes=bart_dims,
                         build=partial(bart_classifier.build, layout=LAYOUT), heads={CLASSIFY: ClassificationHead},
                         onnx_optimizer="bart"))
