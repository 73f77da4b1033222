"""Pegasus (google/pegasus-xsum, pegasus-large, pegasus-cnn_dailymail): Marian's sinusoidal positions (its
checkpoints hold the table; hotrod reads it from them, else computes it), embeddings times sqrt(d_model),
pre-norm layers with a last LayerNorm closing each stack, `final_logits_bias` (`hotrod.models.bart_stack`)."""

from __future__ import annotations

from functools import partial

from hotrod.models.bart_stack import BartLikeModel, Layout, bart_dims
from hotrod.models.marian import sinusoidal_positions
from hotrod.registry import Family, register

LAYOUT = Layout(positions=sinusoidal_positions, pre_norm=True, embedding_norm=False, logits_bias=True)

FAMILY = register(Family(name="pegasus", model_types=("pegasus",), kind="seq2seq", sizes=bart_dims,
                         build=partial(BartLikeModel, layout=LAYOUT), onnx_optimizer="bart"))
