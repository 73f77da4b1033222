"""The modules of a sentence-transformers checkpoint after its Transformer (Pooling, Dense, Normalize), as
frozen steps, and how each is read from its folder: `hotrod.pipelines.sentence` reads modules.json with these
and runs the steps. What a module asks that hotrod does not run is refused here by name, never skipped.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.files import inside
from hotrod.pipelines import splade

MODULES = "modules.json"
# sentence-transformers reads the first of these the Transformer module's folder has.
TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                       "sentence_camembert_config.json", "sentence_albert_config.json",
                       "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# The old boolean keys, in the order their modes are concatenated.
_LEGACY = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
           "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
           "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_OUTPUT = "sentence_embedding"


@dataclass(frozen=True)
class Pooling:
    modes: tuple[str, ...] = ("mean",)
    include_prompt: bool = True
    type: str = "pooling"


@dataclass(frozen=True)
class Dense:
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a torch.nn module's dotted path
    use_residual: bool
    weights: str  # the weights file, relative to the checkpoint
    type: str = "dense"
    tensors: dict = field(default_factory=dict, repr=False, compare=False)  # read from `weights`, kept off the JSON


@dataclass(frozen=True)
class Normalize:
    type: str = "normalize"


Step = Pooling | Dense | Normalize



def read_json(path: Path, name: str) -> Any:
    file = inside(path, name, f"{path}/{MODULES}")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HotrodError(f"cannot read {file}: {exc}") from None


def module_kind(entry: Any, path: Path) -> str:
    """The module's class name where hotrod runs it (sentence-transformers' own Transformer, Pooling, Dense or
    Normalize, under any of its module paths); anything else is refused by name."""
    module_type = str(entry.get("type", "")) if isinstance(entry, dict) else repr(entry)
    name = module_type.rpartition(".")[2]
    if module_type.startswith("sentence_transformers.") and name in ("Transformer", "Pooling", "Dense", "Normalize",
                                                                      splade.MODULE, *splade.TRANSFORMERS):
        return name
    raise HotrodError(f"{path}/{MODULES} has a {module_type} module, which hotrod does not run; it embeds with "
                      "Transformer, Pooling, Dense and Normalize modules only (a SparseEncoder with its "
                      "Transformer and SpladePooling)")


def transformer_config(path: Path) -> tuple[str, dict]:
    for name in TRANSFORMER_CONFIGS:
        if (path / name).is_file():
            return name, read_json(path, name)
    return "", {}


def read_step(module_type: str, config: dict, path: Path, folder: str) -> Step:
    if module_type == splade.MODULE:  # a SparseEncoder's (`hotrod.pipelines.splade`)
        return splade.step(config, path, folder)
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, _OUTPUT) not in (None, _OUTPUT):
            raise HotrodError(f"{path}/{folder} reads or writes {config[key]!r}; hotrod runs modules on the "
                              "sentence embedding only")
    if module_type == "Normalize":
        return Normalize()
    if module_type == "Pooling":
        modes = config.get("pooling_mode")
        if modes is None:
            modes = [mode for key, mode in _LEGACY.items() if config.get(key)] or ["mean"]
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            raise HotrodError(f"{path}/{folder} asks for pooling {unknown or modes}; known: {', '.join(MODES)}")
        return Pooling(modes, bool(config.get("include_prompt", True)))
    function = str(config.get("activation_function") or "torch.nn.modules.activation.Tanh")
    activation(function, f"{path}/{folder}")
    weights = next((f"{folder}/{n}" for n in _WEIGHTS if inside(path, f"{folder}/{n}", MODULES).is_file()), None)
    if weights is None:
        raise HotrodError(f"{path}/{folder} has no weights ({' or '.join(_WEIGHTS)})")
    try:
        step = Dense(int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True)),
                     function, bool(config.get("use_residual", False)), weights)
    except (KeyError, TypeError, ValueError) as exc:
        raise HotrodError(f"{path}/{folder}/config.json is incomplete: {exc}") from None
    step.tensors.update(_read_weights(path / weights))
    return step


def activation(dotted: str, where: str) -> torch.nn.Module:
    """The activation as an instance of the torch.nn module the path names; other code is never imported."""
    module, _, name = dotted.rpartition(".")
    built = None
    if module == "torch.nn" or module.startswith("torch.nn."):
        try:
            built = getattr(importlib.import_module(module), name, None)
        except ImportError:
            built = None
    if not (isinstance(built, type) and issubclass(built, torch.nn.Module)):
        raise HotrodError(f"{where}'s activation_function {dotted!r} is not a torch.nn module; hotrod builds only those")
    return built()


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return {k: v.float() for k, v in load_file(str(file)).items()}
        return {k: v.float() for k, v in torch.load(file, map_location="cpu", weights_only=True).items()}
    except Exception as exc:  # a damaged or foreign file, whatever the reader's complaint
        raise HotrodError(f"cannot read the Dense weights {file}: {exc}") from None


def optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def cut_length(options: dict, where: str) -> int | None:
    """Where the Transformer module cuts texts: its processing_kwargs' max_length (text's over common's), else
    the tokenizer's model_max_length it sets (processor_kwargs, once tokenizer_args), else max_seq_length, as
    sentence-transformers' Transformer reads them. What else would change the tokens is refused by name."""
    for key in ("query_length", "document_length", "query_expansion"):
        if options.get(key) is not None:
            raise HotrodError(f"{where} sets {key}, a multi-vector encoder's; hotrod embeds one vector a text")
    found = optional_int(options.get("max_seq_length"))
    for key in ("tokenizer_args", "processor_kwargs"):
        if (options.get(key) or {}).get("model_max_length") is not None:
            found = optional_int(options[key]["model_max_length"])
    processing = options.get("processing_kwargs") or {}
    for part in ("common", "text"):
        kwargs = processing.get(part) or {}
        unknown = sorted(set(kwargs) - {"max_length"})
        if unknown:
            raise HotrodError(f"{where}'s processing_kwargs set {part}.{unknown[0]}; hotrod reads max_length only")
        found = optional_int(kwargs.get("max_length", found))
    others = sorted(set(processing) - {"common", "text"})
    if others:
        raise HotrodError(f"{where}'s processing_kwargs set {others[0]}; hotrod embeds text only")
    return found
