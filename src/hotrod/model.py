"""HotrodModel: the drop-in object users call like a transformers model.

`generate` and `__call__` take transformers' argument names and return what transformers returns
(a LongTensor laid out the same way; an output with `.logits` or `.last_hidden_state`). Everything
kind-specific is in the decoding states and the kind's spec (`hotrod.kinds`); nothing here knows a family
or a backend.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from hotrod import precisions, tasks
from hotrod.batching import plan, trailing_lengths
from hotrod.errors import HotrodError, check_count
from hotrod.generation import config as gen_config
from hotrod.generation import draft_rules
from hotrod.generation.assist import Assist
from hotrod.generation.feeds import compact_prompts
from hotrod.generation.lookup import Lookup
from hotrod.generation.search import generate as run_search
from hotrod.generation.self_cache import SelfCache
from hotrod.generation.spares import Spares
from hotrod.generation.state import DecodingState
from hotrod.kinds import spec as kind_spec
from hotrod.model_inputs import as_mask, check_row, left_padded, token_ids, token_types
from hotrod.outputs import ModelOutput
from hotrod.pipelines import languages, sentence
from hotrod.pipelines.base import Row, padded
from hotrod.pipelines.sentence import SentencePipeline
from hotrod.registry import Family

# What finished generate() calls keep for the next ones at most, in all (`hotrod.generation.spares`):
# GPT-2 124M's whole 1,024 positions at fp32 for one row take 72 MiB.
SPARE_CACHE_BYTES = 256 * 2**20


class HotrodModel:
    def __init__(self, family: Family, config, backend, generation_config, tokenizer=None, manifest: dict | None = None,
                 sentence: SentencePipeline | None = None):
        self.family = family
        self.sentence = sentence  # a sentence-transformers checkpoint's modules, which `embed` runs
        self.config = config
        self.backend = backend
        self.generation_config = generation_config
        self.tokenizer = tokenizer
        self.manifest = manifest
        self.dims = family.dims(config)
        self.kind = family.kind_of(config)  # its task's, where the family runs that task as another kind
        self.spec = kind_spec(self.kind)
        self.task = self.dims.task
        self.labels = tasks.labels(config, self.task)  # output index -> label, for labelled heads
        # what it answers (a variant, if one fits)
        self.task_spec = tasks.of_model(self.task, self.dims.num_labels, list(self.labels.values()))
        self._vocabulary_of: tuple[Any, int] | None = None  # the tokenizer and size `_vocabulary_hash` is of
        self._spares = Spares(SPARE_CACHE_BYTES)  # finished generate() calls' states (`_generation_state`)
        self._vocabulary_hash = 0

    @property
    def invariant_rows(self) -> int:
        """What a graph call's rows must be a multiple of for each row's result not to depend on how many run
        beside it (`hotrod.precisions.Precision.invariant_rows`)."""
        options = (self.manifest or {}).get("options") or {}
        return precisions.invariant_rows(options.get("precision"))

    @property
    def device(self) -> str:
        return self.backend.device

    # -- generation -----------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, input_ids=None, generation_config=None, *, attention_mask=None, **kwargs: Any) -> torch.LongTensor:
        """Greedy, beam or sampled generation with transformers' arguments (in its order: the prompt, then a
        GenerationConfig; the mask by name) and output layout; hotrod's own
        `target_language=` ("fr_XX", "fr", "fra_Latn") is forced_bos_token_id by the tokenizer's language code."""
        if not self.spec.generates:
            raise HotrodError(f"this {self.config.model_type} model runs as an encoder ({self.task}); it has no "
                              "generate(): call it, or its task's method (embed(), classify(), ...)")
        input_ids = kwargs.pop("inputs", None) if input_ids is None else input_ids  # transformers' name for it
        # The sequences go where the prompt came from, as transformers' (its prompt is on the model's device).
        device = input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
        return self._generate(token_ids(input_ids, self.dims), attention_mask, generation_config, kwargs).to(device)

    def _generate(self, input_ids: torch.Tensor, attention_mask, generation_config, kwargs: dict) -> torch.Tensor:
        code = kwargs.pop(languages.FIELD, None)  # None: no language named (the model's own forced BOS stays)
        if code is not None:
            kwargs["forced_bos_token_id"] = languages.forced_bos(self.tokenizer, code, kwargs.get("forced_bos_token_id"),
                                                                 self.dims.vocab_size)
        lookup, assistant, assistant_tokens = draft_rules.draft_arguments(self, kwargs)
        values = gen_config.merge(self.generation_config, generation_config, kwargs)
        if attention_mask is not None:
            attention_mask = as_mask(attention_mask, input_ids.shape, left=self.spec.pads_left)
        elif self.spec.infers_padding:
            attention_mask = left_padded(_infer_mask(input_ids, values))
        else:  # transformers infers padding only for decoder-only models
            attention_mask = torch.ones_like(input_ids)
        settings = self.settings(input_ids.shape[1], values)
        with self._generation_state(settings) as state, torch_threads(self.backend.loop_threads):
            if lookup:
                draft_rules.check_drafting("prompt_lookup_num_tokens", self, input_ids.shape[0], settings)
                return Lookup(state, settings, lookup).generate(input_ids, attention_mask)
            if assistant is not None:
                draft_rules.check_drafting("assistant_model", self, input_ids.shape[0], settings, assistant)
                # The assistant's rows begin as the model's do (an encoder-decoder's with the same start token).
                settings = dataclasses.replace(settings, decoder_start_token_id=self._start_token(settings))
                with assistant._generation_state(settings) as drafts:
                    return Assist(state, settings, drafts, assistant_tokens).generate(input_ids, attention_mask)
            return run_search(state, input_ids, attention_mask, settings)

    @contextmanager
    def _generation_state(self, settings: gen_config.Settings) -> Iterator[DecodingState]:
        """A fresh decoding state for one generate() call, in the cache buffers a finished call left where they
        fit (`hotrod.generation.spares`), given back for the next call afterwards, unless the backend pools
        its buffers itself (`pools_cache`, the static engine). A call that started nothing gives back the
        spare it took instead."""
        if self.backend.pools_cache:
            yield self.decoding_state(settings)
            return
        state, spare = self.decoding_state(settings), self._spares.take()
        if spare is not None:
            state.recycle(spare)
        try:
            yield state
        finally:
            state.finish()
            kept = state if state.nbytes() else spare  # a call that started nothing leaves the spare as it was
            if kept is not None:
                self._spares.give(kept)

    def free_cache(self) -> None:
        """Let go of the cache buffers finished generate() calls kept for the next ones (at most
        `SPARE_CACHE_BYTES` in all): the memory goes back before a long idle spell."""
        self._spares.clear()

    def _vocabulary(self) -> int | None:
        """A fingerprint of the tokenizer's vocabulary (None without a tokenizer), taken again only when the
        tokenizer or its size changes: reading a large vocabulary costs as much as a generate() call."""
        if self.tokenizer is None:
            return None
        seen = (self.tokenizer, len(self.tokenizer))
        if self._vocabulary_of is None or self._vocabulary_of[0] is not seen[0] or self._vocabulary_of[1] != seen[1]:
            self._vocabulary_of, self._vocabulary_hash = seen, hash(frozenset(self.tokenizer.get_vocab().items()))
        return self._vocabulary_hash

    def settings(self, prompt_length: int, values: dict[str, Any]) -> gen_config.Settings:
        """Checked settings for a prompt of `prompt_length` tokens, from `gen_config.merge`'s values."""
        # The decoder's positions: after the prompt's (decoder-only), or after the start token's.
        return gen_config.resolve(values, self.spec.decoder_prompt(prompt_length), self.dims.max_positions,
                                  self.dims.vocab_size)

    def decoding_state(self, settings: gen_config.Settings, capacity: int | None = None) -> DecodingState:
        """A fresh decoding state for this model (the server keeps one per running batch), whose cache
        starts with `capacity` positions per row (default: the settings' whole `max_length`)."""
        capacity = settings.max_length if capacity is None else capacity
        return self.spec.new_state(self.backend, self.dims, self._start_token(settings), capacity)

    def _start_token(self, settings: gen_config.Settings) -> int | None:
        """An encoder-decoder's first decoder token: the settings', the model config's, else BOS (transformers')."""
        starts = (settings.decoder_start_token_id, getattr(self.config, "decoder_start_token_id", None))
        return next((token for token in starts if token is not None), settings.bos_token_id)

    # -- forward --------------------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(self, input_ids=None, attention_mask=None, *third, token_type_ids=None, decoder_input_ids=None,
                 **unsupported: Any) -> ModelOutput:
        """One forward pass with transformers' output fields: a language model's `.logits`; an encoder's head's.
        The third positional argument is transformers': an encoder-decoder's decoder_input_ids, else token_type_ids."""
        if unsupported:  # output_hidden_states=, past_key_values=, ...: one line each, not a TypeError
            raise HotrodError(f"model() does not support {next(iter(unsupported))}=")
        if len(third) > 1 or (third and (token_type_ids, decoder_input_ids) != (None, None)):
            raise HotrodError("model() takes input_ids, attention_mask and one more input by position; pass the rest "
                              "by name")
        if third and getattr(self.config, "is_encoder_decoder", False):  # T5, BART, and a BART head
            decoder_input_ids = third[0]
        elif third and not self.spec.generates:
            token_type_ids = third[0]
        elif third:
            raise HotrodError("a decoder model's forward takes input_ids and attention_mask by position")
        with torch_threads(self.backend.loop_threads):
            return self._forward(input_ids, attention_mask, token_type_ids, decoder_input_ids)

    forward = __call__

    def _forward(self, input_ids, attention_mask, token_type_ids, decoder_input_ids) -> ModelOutput:
        # Outputs go where the inputs came from, as transformers' do (its inputs are on the model's device).
        device = input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
        input_ids = token_ids(input_ids, self.dims)
        mask = torch.ones_like(input_ids) if attention_mask is None else as_mask(attention_mask, input_ids.shape)
        if not self.spec.generates:
            if decoder_input_ids is not None:  # a BART head builds its decoder's inputs from input_ids in its graph
                raise HotrodError(f"decoder_input_ids: this {self.config.model_type} model runs as an encoder, its "
                                  "decoder's inputs made from input_ids as transformers makes them by default")
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_types(token_type_ids, input_ids.shape, self.dims)
            return ModelOutput(**self._encode(input_ids, mask, types, device))
        if token_type_ids is not None:  # a generating model's graphs have no such input
            raise HotrodError(f"token_type_ids: a {self.spec.name} model's forward takes none here")
        if not self.spec.encodes:
            return ModelOutput(logits=self._decoder_logits(input_ids, mask).to(device))
        if decoder_input_ids is None:
            raise HotrodError("an encoder-decoder forward needs decoder_input_ids")
        decoder_ids = token_ids(decoder_input_ids, self.dims, check_length=False)
        hidden = self.backend.run("encoder", {"input_ids": input_ids, "attention_mask": mask})["encoder_hidden_states"]
        out = self.backend.run(
            "decoder_init",
            {"decoder_input_ids": decoder_ids, "encoder_attention_mask": mask, "encoder_hidden_states": hidden},
        )
        return ModelOutput(
            logits=self._host(out["logits"], device), encoder_last_hidden_state=self._host(hidden, device)
        )

    def _decoder_logits(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits at every position, as transformers' forward: positions are column indices, masked
        tokens are not attended to. Masked positions themselves get zero logits (they have no meaning).
        """
        ids, columns, lengths = compact_prompts(input_ids, mask)
        rows, width = ids.shape
        kv = SelfCache(self.backend, self.dims, self.dims.num_layers, width)
        kv.allocate(rows, width)
        feeds = {"input_ids": ids, "position_ids": columns, "logits_positions": torch.arange(width).expand(rows, width),
                 **kv.feeds(lengths - 1, width)}
        logits = self._host(self.backend.run("decoder", feeds, held=kv.held())["logits"])
        if width == input_ids.shape[1] and bool(mask.ne(0).all()):
            return logits
        result = logits.new_zeros(*input_ids.shape, logits.shape[-1])
        real = torch.arange(width)[None, :] < lengths[:, None]
        result[torch.arange(rows)[:, None].expand(rows, width)[real], columns[real]] = logits[real]
        return result

    # -- embeddings -----------------------------------------------------------------------------

    @torch.inference_mode()
    def embed(self, texts_or_ids, pooling: str | None = None, normalize: bool | None = None, batch_size: int = 32, *,
              prompt_name: str | None = None, prompt: str | None = None, truncate_dim: int | None = None) -> torch.Tensor:
        """Sentence embeddings [n, width]: for a sentence-transformers checkpoint what
        `SentenceTransformer(path).encode(texts, prompt_name=, prompt=, truncate_dim=)` gives (its pooling,
        Dense, Normalize, prompts and max_seq_length; `hotrod.pipelines.sentence`), else mean pooling of
        the last hidden state. `pooling` ("mean" | "cls") replaces the checkpoint's pooling modes;
        `normalize` True normalizes the result (after truncate_dim, as encode's normalize_embeddings), False
        leaves out the checkpoint's Normalize. Token ids take no prompt (not even the default one).

        Inputs are sorted by length and run in sub-batches padded only to their own longest member, so
        mixed lengths do not pay for each other's padding; rows come back in the caller's order.
        """
        if not self.spec.encodes:
            raise HotrodError(f"{self.config.model_type} is a decoder-only model; embed() needs an encoder")
        if not tasks.get(self.task).embeds:
            raise HotrodError(f"this model ends in its {self.task} head, so it has no embeddings; build it with "
                              f"--task {tasks.family_tasks(self.family)[0]} (task=) for the bare encoder")
        check_count("batch_size", batch_size)
        with torch_threads(self.backend.loop_threads):
            return sentence.embed(self, texts_or_ids, pooling, normalize, batch_size, prompt_name, prompt, truncate_dim)

    def embedding_settings(self, pooling: str | None = None, normalize: bool | None = None,
                           truncate_dim: int | None = None) -> dict:
        """What `embed(pooling=, normalize=, truncate_dim=)` applies: the pooling modes, and whether its vectors
        are unit length."""
        return sentence.settings(self, pooling, normalize, truncate_dim)

    # -- task heads (`hotrod.pipelines`) -------------------------------------------------------------

    @torch.inference_mode()
    def run_rows(self, rows: Sequence[Row], batch_size: int = 32) -> list[dict[str, torch.Tensor]]:
        """Each row's head outputs, per-token ones cut to the row's length: rows of similar length run
        together, padded only to their own longest (`hotrod.batching.plan`)."""
        check_count("batch_size", batch_size)
        results: list[dict[str, torch.Tensor]] = [{} for _ in rows]
        io = self.spec.contracts(self.dims)["encoder"]
        pad = self._pad_id()
        with torch_threads(self.backend.loop_threads):
            for group in plan([len(row) for row in rows], batch_size):
                members = [rows[i] for i in group]
                for row in members:
                    check_row(row.input_ids, self.dims)
                out = self._encode(*padded(members, pad))
                for position, (index, row) in enumerate(zip(group, members)):
                    results[index] = {spec.name: out[spec.name][position, :len(row)] if "sequence" in spec.axes
                                      else out[spec.name][position] for spec in io.outputs}
        return results

    def run_task(self, task: str, *args: Any, **kwargs: Any) -> Any:
        """The answer of `task`'s pipeline (`hotrod.pipelines`) to the arguments of its `prepare`: the task
        methods (`classify`, `rerank`, `tag`, `answer`, and any registered task's) call this."""
        spec = tasks.get(task)
        refusal = spec.refusal(self.task, self.dims.num_labels, names=list(self.labels.values()))
        if refusal:
            raise HotrodError(refusal)
        try:  # an argument the pipeline lacks (transformers' stride=, batch_size=) is one line, not a TypeError
            inspect.signature(spec.pipeline.prepare).bind(self, *args, **kwargs)
        except TypeError as exc:
            raise HotrodError(f"{spec.method}(): {exc}") from None
        prepared = spec.pipeline.prepare(self, *args, **kwargs)
        return spec.pipeline.finish(self, prepared, self.run_rows(prepared.rows))

    def __getattr__(self, name: str) -> Any:
        """A task's method (`TaskSpec.method`): its pipeline's `prepare`, documented there, run by `run_task`."""
        spec = tasks.by_method(name) if not name.startswith("_") else None
        if spec is None or spec.pipeline is None:
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        return _TaskMethod(self, spec)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(s.method for s in tasks.all_specs() if s.method and s.pipeline)})

    def _encode(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor,
                device: torch.device | None = None) -> dict[str, torch.Tensor]:
        """The encoder graph's outputs by name, on `device` (the CPU by default); a right-padded batch runs
        as padding-free sub-batches where the backend's calls cost little (`call_overhead_tokens`).

        Per-token outputs past a row's length are zero (transformers fills them with values of no meaning).
        """
        io = self.spec.contracts(self.dims)["encoder"]
        lengths = trailing_lengths(mask) if ids.shape[0] > 1 else None
        if lengths is None or min(lengths) == ids.shape[1]:
            out = self.backend.run("encoder", {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
            return {name: self._host(out[name], device) for name in io.output_names}
        result = {t.name: torch.zeros(ids.shape[0], *(ids.shape[1] if a == "sequence" else a for a in t.axes[1:]),
                                      device=device) for t in io.outputs}
        groups = plan(lengths, max_batch=len(lengths), overhead=self.backend.call_overhead_tokens)
        # One call (a GPU's, or rows of like length): the rows in their own order, no list indexing a GPU's
        # tensors (a copy of the list that waits for the device).
        for group in groups if len(groups) > 1 else [slice(None)]:
            width = max(lengths) if isinstance(group, slice) else lengths[group[-1]]
            feeds = {"input_ids": ids[group, :width], "attention_mask": mask[group, :width],
                     "token_type_ids": types[group, :width]}
            out = self.backend.run("encoder", feeds)
            for spec in io.outputs:
                value = self._host(out[spec.name], device).float()
                if "sequence" not in spec.axes:
                    result[spec.name][group] = value
                    continue
                real = mask[group, :width].to(value.device).reshape(value.shape[0], width, *[1] * (value.dim() - 2))
                result[spec.name][group, :width] = value * real
        return result

    def hidden_states(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's last hidden state [B, S, H] (fp32, on the CPU) of `rows` padded on the right, and their mask."""
        width = max(len(r) for r in rows)
        pad = self._pad_id()
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        out = self.backend.run("encoder", feeds)
        return self._host(next(iter(out.values()))).float(), mask

    def _host(self, value, device: torch.device | None = None) -> torch.Tensor:
        """A backend output as the caller gets it: a torch tensor where the inputs were (the CPU unless
        the caller's tensors were on a GPU)."""
        return self.backend.to_torch(value).to(device or "cpu")

    def _pad_id(self) -> int:
        pad = getattr(self.config, "pad_token_id", None)
        return int(pad) if pad is not None else 0


class _TaskMethod:
    """`model.<method>(...)`: the task's pipeline with the model bound, its `prepare`'s signature shown."""

    def __init__(self, model: HotrodModel, spec: Any):
        self.model, self.spec = model, spec
        self.__doc__, self.__name__ = spec.pipeline.prepare.__doc__, spec.method

    @property
    def __signature__(self) -> inspect.Signature:
        """Made when help() or inspect asks, not at every call of the method."""
        signature = inspect.signature(self.spec.pipeline.prepare)
        return signature.replace(parameters=list(signature.parameters.values())[1:])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.run_task(self.spec.name, *args, **kwargs)


def _infer_mask(input_ids: torch.Tensor, values: dict) -> torch.Tensor:
    """transformers' inference for decoder-only prompts: padding where the pad token differs from EOS."""
    pad, eos = values.get("pad_token_id"), values.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if pad is not None and pad not in eos_ids and bool((input_ids == pad).any()):
        return (input_ids != pad).long()
    return torch.ones_like(input_ids)


@contextmanager
def torch_threads(threads: int | None):
    """Run the block with torch limited to `threads` (None: unchanged), then restore the old count."""
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
