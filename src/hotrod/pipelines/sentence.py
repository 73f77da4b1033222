"""A sentence-transformers checkpoint's own embedding: its modules read whole and run as `encode` runs them.

Most embedding checkpoints keep what turns the encoder's last hidden state into their vector outside the
transformers config: the pooling (`1_Pooling/config.json`), a Dense projection (`2_Dense/`), a Normalize
module, the tokenization limits (`sentence_bert_config.json`) and named prompts
(`config_sentence_transformers.json`), listed in order by `modules.json`. A default pooling would give
other vectors than `SentenceTransformer(path).encode(texts)` without a word, so the modules are read
whole: a module hotrod does not run is refused by name, never skipped. A checkpoint without modules.json
keeps transformers' reading (`PLAIN`: mean pooling, no normalization).

`SentencePipeline` is the frozen description (what the artifact's manifest records, `to_dict`); `embed`
runs it over a model's encoder, following sentence-transformers 6.2 (`Pooling._forward_padded`,
`Dense.forward`, `Normalize`, `Transformer.preprocess`, `_get_prompt_length`, `encode`'s `truncate_dim`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hotrod.batching import plan
from hotrod.errors import HotrodError
from hotrod.files import inside
from hotrod.model_inputs import embed_rows
from hotrod.pipelines import splade
from hotrod.pipelines.activation import recorded_in_files
from hotrod.pipelines.sentence_tokens import Tokenized, tokenize

MODULES = "modules.json"
SETTINGS = "config_sentence_transformers.json"
# sentence-transformers reads the first of these the Transformer module's folder has.
TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                       "sentence_camembert_config.json", "sentence_albert_config.json",
                       "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# The old boolean keys, in the order their modes are concatenated.
_LEGACY = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
           "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
           "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
DEFAULT_PROMPTS = ("query", "document")  # SentenceTransformer's own names, empty unless the checkpoint fills them
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


@dataclass(frozen=True)
class SentencePipeline:
    steps: tuple[Step, ...] = (Pooling(),)
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: tuple[tuple[str, str | None], ...] = ()
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    files: tuple[str, ...] = ()  # what the checkpoint holds of it, relative paths: an artifact copies them

    @classmethod
    def read(cls, path: str | Path) -> SentencePipeline | None:
        """The checkpoint's modules, or None when it has no modules.json (a plain transformers checkpoint)."""
        path = Path(path)
        if not (path / MODULES).is_file() or recorded_in_files(path) is not None:
            return None  # a CrossEncoder's modules.json lists only its Transformer: its head is the checkpoint's
        steps, files, transformer, transformer_name = [], [MODULES], None, ""
        entries = _json(path, MODULES)
        for entry in entries:
            module_type = _module_kind(entry, path)
            folder = str(entry.get("path") or "")
            if module_type in ("Transformer", *splade.TRANSFORMERS):
                if folder or steps or transformer is not None:
                    raise HotrodError(f"{path}/{MODULES} puts its Transformer in {folder!r} or after other "
                                      "modules; hotrod runs the checkpoint's own encoder first")
                transformer, transformer_name = _transformer_config(path), module_type
                files += [transformer[0]] if transformer[0] else []
                continue
            if transformer is None:
                raise HotrodError(f"{path}/{MODULES} does not begin with a Transformer module")
            config_name = f"{folder}/config.json" if folder else ""
            config = _json(path, config_name) if config_name and inside(path, config_name, MODULES).is_file() else {}
            files += [config_name] if config else []
            step = _step(module_type, config, path, folder)
            if isinstance(step, Dense):
                files.append(step.weights)
            steps.append(step)
        options = (transformer or ("", {}))[1]
        sparse = splade.check_order(steps, splade.transformer_task(transformer_name, options), f"{path}/{MODULES}",
                                    entries)
        pools = sum(isinstance(s, Pooling) for s in steps)
        if not sparse and (not steps or not isinstance(steps[0], Pooling) or pools > 1):
            raise HotrodError(f"{path}/{MODULES} has no single Pooling module right after its Transformer; "
                              "hotrod embeds with exactly one")
        settings = _json(path, SETTINGS) if (path / SETTINGS).is_file() else {}
        prompts = {**dict.fromkeys(DEFAULT_PROMPTS), **(settings.get("prompts") or {})}
        return cls(tuple(steps), _optional_int(options.get("max_seq_length")), bool(options.get("do_lower_case")),
                   tuple(prompts.items()), settings.get("default_prompt_name"), settings.get("similarity_fn_name"),
                   tuple(files + ([SETTINGS] if settings else [])))

    def to_dict(self) -> dict:
        """The JSON the artifact's manifest records ("sentence_transformers")."""
        steps = [{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(s).items() if k != "tensors"}
                 for s in self.steps]
        return {"modules": steps, "max_seq_length": self.max_seq_length, "do_lower_case": self.do_lower_case,
                "prompts": dict(self.prompts), "default_prompt_name": self.default_prompt_name,
                "similarity_fn_name": self.similarity_fn_name, "files": list(self.files)}

    def resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """The prompt text `encode` would prepend: `prompt`, the named one, or the default one."""
        if prompt is not None and prompt_name is not None:
            raise HotrodError("give prompt or prompt_name, not both")
        if prompt is not None:
            return prompt
        known = dict(self.prompts)
        if prompt_name is not None:
            if prompt_name not in known:
                raise HotrodError(f"unknown prompt_name {prompt_name!r}; this model knows "
                                  f"{', '.join(known) or 'no prompts'}")
            return known[prompt_name]
        return known.get(self.default_prompt_name) if self.default_prompt_name is not None else None

    def with_overrides(self, pooling: str | None, normalize: bool | None) -> tuple[Step, ...]:
        """The steps as run: `pooling` replaces the Pooling module's modes, `normalize=False` drops the
        Normalize modules (True normalizes after truncation, in `embed`)."""
        steps = list(self.steps)
        if pooling is not None:
            if pooling not in ("mean", "cls"):
                raise HotrodError(f"unknown pooling {pooling!r}; choose from mean, cls")
            steps[0] = dataclasses.replace(steps[0], modes=(pooling,))
        if normalize is False:
            steps = [s for s in steps if not isinstance(s, Normalize)]
        return tuple(steps)


PLAIN = SentencePipeline()  # a transformers checkpoint's reading: mean pooling, nothing after


def output_width(steps: tuple[Step, ...], hidden: int) -> int:
    """The vector's width after `steps`, checking that each Dense takes what comes before it."""
    width = hidden
    for step in steps:
        if isinstance(step, Pooling):
            width = hidden * len(step.modes)
        elif isinstance(step, Dense):
            if step.in_features != width:
                raise HotrodError(f"the checkpoint's Dense takes {step.in_features} wide vectors, but the pooling "
                                  f"gives {width}; leave pooling to the checkpoint")
            width = step.out_features
    return width


def width(model: Any) -> int:
    """The width of the model's own embeddings (its pipeline's, else the hidden size)."""
    return output_width((model.sentence or PLAIN).steps, model.dims.hidden_size)


def settings(model: Any, pooling: str | None, normalize: bool | None) -> dict:
    """What `embed` applies for these overrides (the command prints it): the pooling modes, joined by "+",
    and whether the vectors are normalized."""
    steps = (model.sentence or PLAIN).with_overrides(pooling, normalize)
    normalized = bool(normalize) or (normalize is None and any(isinstance(s, Normalize) for s in steps))
    return {"pooling": "+".join(steps[0].modes), "normalized": normalized}


def embed(model: Any, inputs: Any, pooling: str | None, normalize: bool | None, batch_size: int,
          prompt_name: str | None, prompt: str | None, truncate_dim: int | None) -> torch.Tensor:
    """What `HotrodModel.embed` returns (its docstring says what each argument does); `inputs` may also be
    `Tokenized` rows."""
    pipe = model.sentence or PLAIN
    texts = _texts(inputs)
    if texts is None and (prompt is not None or prompt_name is not None):
        raise HotrodError("a prompt goes before text; token ids cannot take prompt or prompt_name")
    chosen = pipe.resolve_prompt(prompt, prompt_name) if texts is not None else None
    steps = pipe.with_overrides(pooling, normalize)
    width = output_width(steps, model.dims.hidden_size)
    if truncate_dim is not None and not (isinstance(truncate_dim, int) and 1 <= truncate_dim <= width):
        raise HotrodError(f"truncate_dim must be between 1 and the embedding's width {width}, got {truncate_dim!r}")
    if isinstance(inputs, Tokenized):
        rows, prompt_length = embed_rows(inputs.rows, model.tokenizer, model.dims), inputs.prompt_length
    elif texts is None:
        rows, prompt_length = embed_rows(inputs, model.tokenizer, model.dims), 0
    else:
        tokenized = tokenize(model, texts, chosen)
        rows, prompt_length = tokenized.rows, tokenized.prompt_length
    result = torch.empty(len(rows), width)
    for group in plan([len(r) for r in rows], batch_size):
        hidden, mask = model.hidden_states([rows[i] for i in group])
        result[group] = run(steps, hidden, mask, prompt_length)
    if truncate_dim is not None:
        result = result[:, :truncate_dim]
    return torch.nn.functional.normalize(result, p=2, dim=-1) if normalize else result


def run(steps: tuple[Step, ...], hidden: torch.Tensor, mask: torch.Tensor, prompt_length: int = 0) -> torch.Tensor:
    """The steps over a right-padded batch's last hidden state [B, S, H] and its mask [B, S]."""
    vector = hidden
    for step in steps:
        if isinstance(step, Pooling):
            vector = pool(step, hidden, mask, prompt_length)
        elif isinstance(step, Dense):
            vector = _dense(step, vector)
        else:
            vector = torch.nn.functional.normalize(vector, p=2, dim=-1)
    return vector


def pool(step: Pooling, hidden: torch.Tensor, mask: torch.Tensor, prompt_length: int = 0) -> torch.Tensor:
    """sentence-transformers' `Pooling._forward_padded` for right-padded rows, its modes concatenated in order."""
    original, mask = mask, mask.clone()
    if prompt_length and not step.include_prompt:
        mask[:, :prompt_length] = 0
    vectors = []
    float_mask = mask.unsqueeze(-1).to(hidden.dtype)
    for mode in step.modes:
        if mode == "cls":
            first = mask.to(torch.int).argmax(dim=1)
            vectors.append(hidden[torch.arange(hidden.shape[0]), first])
        elif mode == "max":
            vectors.append(hidden.masked_fill(float_mask == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            count = float_mask.sum(dim=1).clamp(min=1e-9)
            vectors.append((hidden * float_mask).sum(dim=1) / (count if mode == "mean" else count.sqrt()))
        elif mode == "weightedmean":
            weights = torch.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype).view(1, -1, 1)
            weights = weights - original.to(torch.int32).argmax(dim=1).view(-1, 1, 1)
            weighted = float_mask * weights
            vectors.append((hidden * weighted).sum(dim=1) / weighted.sum(dim=1).clamp(min=1e-9))
        else:  # lasttoken: the last position the mask keeps
            values, index = mask.flip(1).max(1)
            index = torch.where(values == 0, hidden.shape[1] - 1, index)
            vectors.append((hidden * float_mask)[torch.arange(hidden.shape[0]), hidden.shape[1] - index - 1])
    return torch.cat(vectors, dim=-1)


# -- reading ----------------------------------------------------------------------------------------


def _json(path: Path, name: str) -> Any:
    file = inside(path, name, f"{path}/{MODULES}")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HotrodError(f"cannot read {file}: {exc}") from None


def _module_kind(entry: Any, path: Path) -> str:
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


def _transformer_config(path: Path) -> tuple[str, dict]:
    for name in TRANSFORMER_CONFIGS:
        if (path / name).is_file():
            return name, _json(path, name)
    return "", {}


def _step(module_type: str, config: dict, path: Path, folder: str) -> Step:
    if module_type == "Normalize":
        return Normalize()
    if module_type == splade.MODULE:  # a SparseEncoder's (`hotrod.pipelines.splade`)
        return splade.step(config, path, folder)
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, _OUTPUT) not in (None, _OUTPUT):
            raise HotrodError(f"{path}/{folder} reads or writes {config[key]!r}; hotrod runs modules on the "
                              "sentence embedding only")
    if module_type == "Pooling":
        modes = config.get("pooling_mode")
        if modes is None:
            modes = [mode for key, mode in _LEGACY.items() if config.get(key)] or ["mean"]
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            raise HotrodError(f"{path}/{folder} asks for pooling {unknown or modes}; known: {', '.join(MODES)}")
        return Pooling(modes, bool(config.get("include_prompt", True)))
    activation = str(config.get("activation_function") or "torch.nn.modules.activation.Tanh")
    _activation(activation, f"{path}/{folder}")
    weights = next((f"{folder}/{n}" for n in _WEIGHTS if inside(path, f"{folder}/{n}", MODULES).is_file()), None)
    if weights is None:
        raise HotrodError(f"{path}/{folder} has no weights ({' or '.join(_WEIGHTS)})")
    try:
        step = Dense(int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True)),
                     activation, bool(config.get("use_residual", False)), weights)
    except (KeyError, TypeError, ValueError) as exc:
        raise HotrodError(f"{path}/{folder}/config.json is incomplete: {exc}") from None
    step.tensors.update(_read_weights(path / weights))
    return step


def _activation(dotted: str, where: str) -> torch.nn.Module:
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


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


# -- running ----------------------------------------------------------------------------------------


def _dense(step: Dense, vector: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' `Dense.forward`: activation(linear(x)), plus the residual when asked."""
    weights = step.tensors
    out = torch.nn.functional.linear(vector, weights["linear.weight"], weights.get("linear.bias") if step.bias else None)
    out = _activation(step.activation, "Dense")(out)
    if step.use_residual:
        out = out + (vector if step.in_features == step.out_features
                     else torch.nn.functional.linear(vector, weights["residual.weight"]))
    return out


def _texts(inputs: Any) -> list[str] | None:
    """The texts to embed, or None when `inputs` are token ids."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, str) for t in inputs):
        return list(inputs)
    return None
