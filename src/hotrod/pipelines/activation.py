"""The activation a sentence-transformers cross-encoder applies to its logits, read from its config once for
every task that scores with it (`rerank`, and `classify` of a cross-encoder).

sentence-transformers records it as a torch module's dotted path: since v6 in config_sentence_transformers.json
(`activation_fn`, beside `model_type: CrossEncoder`), before that in config.json
(`sentence_transformers.activation_fn`, or before v4 `sbert_ce_default_activation_function`), and
`CrossEncoder.predict` runs the logits through that module. Without `trust_remote_code` it builds only a
path under `torch.`; for any other it falls back to its default (a sigmoid for a one-output head, else the
logits as they are), and so does hotrod, which never imports code a config names outside torch.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hotrod.errors import HotrodError

Activation = Callable[[torch.Tensor], torch.Tensor]


def recorded_path(config: Any) -> str | None:
    """The activation's dotted path a cross-encoder's config records, or None where it records none: a
    checkpoint that was not saved as a CrossEncoder, whose scores are not CrossEncoder's to define."""
    settings = getattr(config, "sentence_transformers", None)
    if isinstance(settings, dict) and "activation_fn" in settings:
        path = settings["activation_fn"]
    else:
        path = getattr(config, "sbert_ce_default_activation_function", None)
    return path if isinstance(path, str) else None


SETTINGS = "config_sentence_transformers.json"


def recorded_in_files(path: Path) -> dict[str, Any] | None:
    """The config settings a CrossEncoder saved by sentence-transformers 6 keeps beside config.json (its
    activation, under config.json's older key, which it takes precedence over as CrossEncoder reads it), or
    None where the checkpoint is no such CrossEncoder."""
    file = path / SETTINGS
    try:
        settings = json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError) as exc:
        raise HotrodError(f"cannot read {file}: {exc}") from None
    if not isinstance(settings, dict) or settings.get("model_type") != "CrossEncoder":
        return None
    kept = {"activation_fn": settings.get("activation_fn")} if isinstance(settings.get("activation_fn"), str) else {}
    prompts, default = settings.get("prompts") or {}, settings.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise HotrodError(f"{file}: prompts must map names to texts")
    if default is not None and default not in prompts:
        raise HotrodError(f"{file}: default_prompt_name {default!r} is not one of its prompts "
                          f"({', '.join(map(repr, prompts)) or 'none'})")
    kept.update({"prompts": prompts, "default_prompt_name": default} if prompts else {})
    return {"sentence_transformers": kept} if kept else {}


def cross_encoder_prompt(config: Any, prompt: str | None, prompt_name: str | None) -> str:
    """The prompt `CrossEncoder.predict` puts before the first text of each input: `prompt`, the named one, or
    the checkpoint's default (sentence-transformers 6 saves prompts with a CrossEncoder); "" for none."""
    if prompt is not None and prompt_name is not None:
        raise HotrodError("give prompt or prompt_name, not both")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise HotrodError(f"prompt must be a text, got {type(prompt).__name__}")
        return prompt
    settings = getattr(config, "sentence_transformers", None)
    settings = settings if isinstance(settings, dict) else {}
    prompts = settings.get("prompts") or {}
    if prompt_name is not None and prompt_name not in prompts:
        raise HotrodError(f"unknown prompt_name {prompt_name!r}; this model knows {', '.join(prompts) or 'no prompts'}")
    name = prompt_name if prompt_name is not None else settings.get("default_prompt_name")
    return prompts.get(name, "") if name is not None else ""


def cross_encoder_activation(config: Any) -> Activation | None:
    """What `CrossEncoder(path).predict` applies to this config's logits by default, or None where the config
    is not a cross-encoder's (the caller keeps its own default). A path under torch that names no module
    buildable without arguments is refused in one line naming it, as CrossEncoder would fail to load."""
    path = recorded_path(config)
    if path is None:
        return None
    if path.startswith("torch."):
        return torch_module(path)
    return torch.nn.Sigmoid() if getattr(config, "num_labels", 1) == 1 else torch.nn.Identity()


def torch_module(path: str) -> torch.nn.Module:
    """The torch module at a dotted path, built without arguments as CrossEncoder builds it."""
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        found = None
    if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
        raise HotrodError(f"the cross-encoder's activation {path!r} in its config is not a torch module")
    try:
        return found()
    except TypeError:
        raise HotrodError(f"the cross-encoder's activation {path!r} cannot be built without arguments") from None


def apply_activation(activation: Activation, logits: torch.Tensor) -> torch.Tensor:
    """One row's scores [num_labels]: the activation run on the row as CrossEncoder runs it on a batch
    ([1, num_labels]), so a module that picks its dimension from the rank (Softmax()) picks the labels'."""
    return activation(logits.float().reshape(1, -1)).reshape(-1)
