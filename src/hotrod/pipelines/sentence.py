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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hotrod.batching import plan
from hotrod.errors import HotrodError
from hotrod.files import inside
from hotrod.model_inputs import embed_rows
from hotrod.pipelines import splade
from hotrod.pipelines.activation import recorded_in_files
from hotrod.pipelines.sentence_modules import (
    MODULES,
    Dense,
    Normalize,
    Pooling,
    Step,
    activation,
    cut_length,
    module_kind,
    read_json,
    read_step,
    transformer_config,
)
from hotrod.pipelines.sentence_tokens import Tokenized, tokenize

SETTINGS = "config_sentence_transformers.json"
DEFAULT_PROMPTS = ("query", "document")  # SentenceTransformer's own names, empty unless the checkpoint fills them


@dataclass(frozen=True)
class SentencePipeline:
    steps: tuple[Step, ...] = (Pooling(),)
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: tuple[tuple[str, str | None], ...] = ()
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    truncate_dim: int | None = None  # encode's default truncate_dim (a Matryoshka checkpoint's saved one)
    files: tuple[str, ...] = ()  # what the checkpoint holds of it, relative paths: an artifact copies them

    @classmethod
    def read(cls, path: str | Path) -> SentencePipeline | None:
        """The checkpoint's modules, or None when it has no modules.json (a plain transformers checkpoint)."""
        path = Path(path)
        if not (path / MODULES).is_file() or recorded_in_files(path) is not None:
            return None  # a CrossEncoder's modules.json lists only its Transformer: its head is the checkpoint's
        steps, files, transformer, transformer_name = [], [MODULES], None, ""
        entries = read_json(path, MODULES)
        for entry in entries:
            module_type = module_kind(entry, path)
            folder = str(entry.get("path") or "")
            if module_type in ("Transformer", *splade.TRANSFORMERS):
                if folder or steps or transformer is not None:
                    raise HotrodError(f"{path}/{MODULES} puts its Transformer in {folder!r} or after other "
                                      "modules; hotrod runs the checkpoint's own encoder first")
                transformer, transformer_name = transformer_config(path), module_type
                files += [transformer[0]] if transformer[0] else []
                continue
            if transformer is None:
                raise HotrodError(f"{path}/{MODULES} does not begin with a Transformer module")
            config_name = f"{folder}/config.json" if folder else ""
            config = read_json(path, config_name) if config_name and inside(path, config_name, MODULES).is_file() else {}
            files += [config_name] if config else []
            step = read_step(module_type, config, path, folder)
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
        settings = read_json(path, SETTINGS) if (path / SETTINGS).is_file() else {}
        prompts = {**dict.fromkeys(DEFAULT_PROMPTS), **(settings.get("prompts") or {})}
        default = settings.get("default_prompt_name")
        if default is not None and default not in prompts:
            raise HotrodError(f"{path}/{SETTINGS}: default_prompt_name {default!r} is not one of its prompts "
                              f"({', '.join(map(repr, prompts))})")
        truncate_dim = settings.get("truncate_dim")
        if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int)
                                         or truncate_dim < 1):
            raise HotrodError(f"{path}/{SETTINGS}: truncate_dim must be a whole number >= 1, got {truncate_dim!r}")
        return cls(tuple(steps), cut_length(options, f"{path}/{transformer[0] if transformer else ''}"),
                   bool(options.get("do_lower_case")), tuple(prompts.items()), default,
                   settings.get("similarity_fn_name"), truncate_dim, tuple(files + ([SETTINGS] if settings else [])))

    def to_dict(self) -> dict:
        """The JSON the artifact's manifest records ("sentence_transformers")."""
        steps = [{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(s).items() if k != "tensors"}
                 for s in self.steps]
        return {"modules": steps, "max_seq_length": self.max_seq_length, "do_lower_case": self.do_lower_case,
                "prompts": dict(self.prompts), "default_prompt_name": self.default_prompt_name,
                "similarity_fn_name": self.similarity_fn_name, "truncate_dim": self.truncate_dim,
                "files": list(self.files)}

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
    """The width of the model's own embeddings (its pipeline's, cut to its truncate_dim; else the hidden size)."""
    pipe = model.sentence or PLAIN
    full = output_width(pipe.steps, model.dims.hidden_size)
    return min(full, pipe.truncate_dim or full)


def settings(model: Any, pooling: str | None, normalize: bool | None, truncate_dim: int | None = None) -> dict:
    """What `embed` applies for these overrides (the command prints it): the pooling modes, joined by "+",
    and whether the vectors are unit length (normalized last, after any cut to truncate_dim)."""
    pipe = model.sentence or PLAIN
    steps = pipe.with_overrides(pooling, normalize)
    cut = truncate_dim or pipe.truncate_dim
    whole = cut is None or cut >= output_width(steps, model.dims.hidden_size)
    normalized = bool(normalize) or (normalize is None and isinstance(steps[-1], Normalize) and whole)
    return {"pooling": "+".join(steps[0].modes), "normalized": normalized}


def embed(model: Any, inputs: Any, pooling: str | None, normalize: bool | None, batch_size: int,
          prompt_name: str | None, prompt: str | None, truncate_dim: int | None) -> torch.Tensor:
    """What `HotrodModel.embed` returns (its docstring says what each argument does); `inputs` may also be
    `Tokenized` rows."""
    pipe = model.sentence or PLAIN
    inputs = _listed(inputs)
    texts = _texts(inputs)
    if texts is None and (prompt is not None or prompt_name is not None):
        raise HotrodError("a prompt goes before text; token ids cannot take prompt or prompt_name")
    chosen = pipe.resolve_prompt(prompt, prompt_name) if texts is not None else None
    steps = pipe.with_overrides(pooling, normalize)
    width = output_width(steps, model.dims.hidden_size)
    if truncate_dim is None and pipe.truncate_dim is not None:  # encode's default: the saved one, a slice that
        truncate_dim = min(pipe.truncate_dim, width)            # keeps all of a narrower vector, as encode's does
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


# -- running ----------------------------------------------------------------------------------------


def _dense(step: Dense, vector: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' `Dense.forward`: activation(linear(x)), plus the residual when asked."""
    weights = step.tensors
    out = torch.nn.functional.linear(vector, weights["linear.weight"], weights.get("linear.bias") if step.bias else None)
    out = activation(step.activation, "Dense")(out)
    if step.use_residual:
        out = out + (vector if step.in_features == step.out_features
                     else torch.nn.functional.linear(vector, weights["residual.weight"]))
    return out


def _listed(inputs: Any) -> Any:
    """`inputs` as encode reads them: a numpy array, a generator or another iterable of texts (or of id rows)
    as a list; a text, a tensor and `Tokenized` rows as they are."""
    if isinstance(inputs, str | bytes | torch.Tensor | Tokenized):
        return inputs
    if hasattr(inputs, "tolist"):  # a numpy array
        return inputs.tolist()
    if isinstance(inputs, Iterable) and not isinstance(inputs, list | tuple | dict):
        return list(inputs)
    return inputs


def _texts(inputs: Any) -> list[str] | None:
    """The texts to embed, or None when `inputs` are token ids."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, str) for t in inputs):
        return list(inputs)
    return None
