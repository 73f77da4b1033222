"""A sentence-transformers `SparseEncoder` checkpoint's modules, as hotrod reads them: SPLADE.

A SparseEncoder is a masked-LM transformer (`MLMTransformer`, or since sentence-transformers 5.4 its
`Transformer` with `transformer_task: "fill-mask"`) followed by `SpladePooling`: each vocabulary entry's
weight is the max (or the sum) over the real tokens of log(1 + relu(mlm_logit)), with a second log1p for
the `log1p_relu` activation. hotrod computes that inside the graph (the head module of each family,
`hotrod.models.heads.SpladeHead`): the [batch, sequence, vocab] logits never leave it.

`SentencePipeline.read` (`hotrod.pipelines.sentence`) hands the modules it finds here, so the checkpoint's
tokenization (max_seq_length, do_lower_case, prompts) is read the one way, and what SpladePooling says
travels in the config under `CONFIG_KEY` for the head (`config_settings`). Any other module a
SparseEncoder may list (SparseAutoEncoder, SparseStaticEmbedding, Router) is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotrod.errors import HotrodError

CONFIG_KEY = "hotrod_splade"  # the config attribute the head reads SpladePooling's settings from
STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
MODULE = "SpladePooling"
TRANSFORMERS = ("MLMTransformer",)  # the SparseEncoder's own transformer module, besides Transformer
FILL_MASK = "fill-mask"
_SETTINGS = "config_sentence_transformers.json"


@dataclass(frozen=True)
class Splade:
    """SpladePooling's settings, and the checkpoint's default `max_active_dims` (encode's top-k, None: all)."""

    pooling_strategy: str = "max"
    activation_function: str = "relu"
    max_active_dims: int | None = None
    type: str = "splade"

    def config_value(self) -> dict:
        """What the head reads (`CONFIG_KEY`)."""
        return {"pooling_strategy": self.pooling_strategy, "activation_function": self.activation_function}


def step(config: dict, path: Path, folder: str) -> Splade:
    """The SpladePooling module in `folder` of the checkpoint at `path` (its config.json read as `config`)."""
    where = f"{path}/{folder}" if folder else str(path)
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in STRATEGIES:
        raise HotrodError(f"{where} asks for SPLADE pooling {strategy!r}; known: {', '.join(STRATEGIES)}")
    if activation not in ACTIVATIONS:
        raise HotrodError(f"{where} asks for the SPLADE activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    return Splade(strategy, activation, _max_active_dims(path))


def check_order(steps: list, transformer_task: Any, where: str, entries: list) -> bool:
    """Whether `steps` (after the Transformer) are a SparseEncoder's: one SpladePooling and nothing else, over
    a fill-mask transformer (`entries`: modules.json's, which name the module in a refusal). A SpladePooling
    after another transformer, or among other modules, is refused."""
    if not any(isinstance(s, Splade) for s in steps):
        return False
    module = next(str(e.get("type")) for e in entries if str(e.get("type", "")).rpartition(".")[2] == MODULE)
    if transformer_task != FILL_MASK:
        raise HotrodError(f"{where} has a {module} module, which hotrod does not run after a "
                          f"{transformer_task or 'feature-extraction'} Transformer: SPLADE pools a {FILL_MASK} "
                          "(masked-LM) transformer's logits")
    if len(steps) != 1:
        raise HotrodError(f"{where} lists {module} with other modules; hotrod runs a SparseEncoder's MLM "
                          "transformer and SpladePooling only")
    return True


def transformer_task(module_name: str, options: dict) -> str | None:
    """The transformer module's task: fill-mask for MLMTransformer, else what its sentence_bert_config says."""
    return FILL_MASK if module_name in TRANSFORMERS else options.get("transformer_task")


def of_steps(steps: tuple) -> Splade | None:
    """The Splade step of a SentencePipeline's steps, or None (a dense embedder)."""
    return next((s for s in steps if isinstance(s, Splade)), None)


def lists_splade(path: Path) -> bool:
    """Whether the checkpoint's modules.json lists a SpladePooling module: read before anything else of it, as
    every config read asks (a dense embedder's Dense weights are not read for it)."""
    file = path / "modules.json"
    if not file.is_file():
        return False
    try:
        entries = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # the sentence-transformers reader says what is wrong with it, when it reads it
    return isinstance(entries, list) and any(
        isinstance(e, dict) and str(e.get("type", "")).rpartition(".")[2] == MODULE for e in entries)


def config_settings(config: Any) -> tuple[str, str]:
    """(pooling_strategy, activation_function) the head applies: the config's `CONFIG_KEY` (a SparseEncoder
    checkpoint's SpladePooling), else SPLADE's own (max, relu) for a plain masked-LM checkpoint."""
    value = getattr(config, CONFIG_KEY, None) or {}
    return value.get("pooling_strategy", "max"), value.get("activation_function", "relu")


def _max_active_dims(path: Path) -> int | None:
    """config_sentence_transformers.json's max_active_dims (encode's default top-k), where it has one."""
    file = path / _SETTINGS
    if not file.is_file():
        return None
    try:
        value = json.loads(file.read_text(encoding="utf-8")).get("max_active_dims")
    except (OSError, ValueError, AttributeError) as exc:
        raise HotrodError(f"cannot read {file}: {exc}") from None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise HotrodError(f"{file}'s max_active_dims must be a whole number >= 1, got {value!r}")
    return value
