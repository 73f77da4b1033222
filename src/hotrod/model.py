"""HotrodModel: the drop-in object users call like a transformers model.

`generate` and `__call__` take transformers' argument names and return what transformers returns
(a LongTensor laid out the same way; an output with `.logits` or `.last_hidden_state`). Everything
kind-specific is in the decoding states and the kind's spec (`hotrod.kinds`); nothing here knows a family
or a backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from hotrod import precisions, tasks
from hotrod.batching import plan, trailing_lengths
from hotrod.errors import HotrodError, check_count
from hotrod.generation import config as gen_config
from hotrod.generation.assist import DEFAULT_DRAFT_TOKENS, Assist
from hotrod.generation.cache import DecodingState, SelfCache, compact_prompts
from hotrod.generation.drafts import MAX_DRAFT_TOKENS
from hotrod.generation.lookup import Lookup
from hotrod.generation.search import generate as run_search
from hotrod.generation.spares import Spares
from hotrod.kinds import spec as kind_spec
from hotrod.pipelines.base import Row
from hotrod.registry import Family

# What finished generate() calls keep for the next ones at most, in all (`hotrod.generation.spares`):
# GPT-2 124M's whole 1,024 positions at fp32 for one row take 72 MiB.
SPARE_CACHE_BYTES = 256 * 2**20


@dataclass
class ModelOutput:
    """What transformers' forward returns, for the fields hotrod computes."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    encoder_last_hidden_state: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # question answering
    end_logits: torch.Tensor | None = None

    def __getitem__(self, key: str) -> torch.Tensor | None:
        return getattr(self, key)


class HotrodModel:
    def __init__(self, family: Family, config, backend, generation_config, tokenizer=None, manifest: dict | None = None):
        self.family = family
        self.config = config
        self.backend = backend
        self.generation_config = generation_config
        self.tokenizer = tokenizer
        self.manifest = manifest
        self.dims = family.dims(config)
        self.kind = family.kind
        self.spec = kind_spec(family.kind)
        self.task = self.dims.task
        self.labels = tasks.labels(config, self.task)  # output index -> label, for labelled heads
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
    def generate(self, input_ids=None, attention_mask=None, generation_config=None, **kwargs: Any) -> torch.LongTensor:
        """Greedy, beam or sampled generation with transformers' arguments and output layout."""
        if not self.spec.generates:
            raise HotrodError(f"{self.config.model_type} is an encoder; it has no generate(), use embed() or call it")
        if input_ids is None:  # transformers' first argument is also called `inputs`
            input_ids = kwargs.pop("inputs", None)
        input_ids = self._ids(input_ids)
        lookup, assistant, assistant_tokens = self._draft_arguments(kwargs)
        values = gen_config.merge(self.generation_config, generation_config, kwargs)
        if attention_mask is not None:
            attention_mask = self._as_long(attention_mask, input_ids.shape)
        elif self.spec.infers_padding:
            attention_mask = _infer_mask(input_ids, values)
        else:  # transformers infers padding only for decoder-only models
            attention_mask = torch.ones_like(input_ids)
        settings = self.settings(input_ids.shape[1], values)
        with self._generation_state(settings) as state, torch_threads(self.backend.loop_threads):
            if lookup:
                self._check_drafting("prompt_lookup_num_tokens", input_ids, settings)
                return Lookup(state, settings, lookup).generate(input_ids, attention_mask)
            if assistant is not None:
                self._check_drafting("assistant_model", input_ids, settings, assistant)
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

    def _draft_arguments(self, kwargs: dict) -> tuple[int, HotrodModel | None, int]:
        """`prompt_lookup_num_tokens` (0: off), `assistant_model` and `num_assistant_tokens`, taken out of
        transformers' arguments and checked."""
        lookup = kwargs.pop("prompt_lookup_num_tokens", None)
        assistant = kwargs.pop("assistant_model", None)
        assistant_tokens = kwargs.pop("num_assistant_tokens", None)
        if assistant is not None and lookup is not None:
            raise HotrodError("pass assistant_model or prompt_lookup_num_tokens, not both: each drafts the tokens")
        if assistant is None and assistant_tokens is not None:
            raise HotrodError("num_assistant_tokens is the assistant's draft length; pass assistant_model too")
        if assistant is not None:
            self._check_assistant(assistant)
        return (0 if lookup is None else _draft_count("prompt_lookup_num_tokens", lookup), assistant,
                DEFAULT_DRAFT_TOKENS if assistant_tokens is None else _draft_count("num_assistant_tokens",
                                                                                   assistant_tokens))

    def _check_assistant(self, assistant: Any) -> None:
        """An assistant drafts this model's tokens: a hotrod model of its kind, over the same vocabulary."""
        if not isinstance(assistant, HotrodModel):
            raise HotrodError(f"assistant_model must be a model loaded with hotrod.load, got {type(assistant).__name__}")
        if assistant.spec != self.spec:
            raise HotrodError(f"assistant_model is a model of kind {assistant.spec.name}; this model, of kind "
                              f"{self.spec.name}, takes drafts from a model of its own kind")
        if assistant.dims.vocab_size != self.dims.vocab_size:
            raise HotrodError(f"assistant_model has {assistant.dims.vocab_size} tokens in its vocabulary, this model "
                              f"{self.dims.vocab_size}: its drafts would not be this model's tokens")
        mine, theirs = self._vocabulary(), assistant._vocabulary()
        if mine is not None and theirs is not None and mine != theirs:
            raise HotrodError("assistant_model's tokenizer differs from this model's: its drafts would not be this "
                              "model's tokens")

    def _vocabulary(self) -> int | None:
        """A fingerprint of the tokenizer's vocabulary (None without a tokenizer), taken again only when the
        tokenizer or its size changes: reading GPT-2's 50,257 entries takes about 60 ms, a call's worth."""
        if self.tokenizer is None:
            return None
        seen = (self.tokenizer, len(self.tokenizer))
        if self._vocabulary_of is None or self._vocabulary_of[0] is not seen[0] or self._vocabulary_of[1] != seen[1]:
            self._vocabulary_of, self._vocabulary_hash = seen, hash(frozenset(self.tokenizer.get_vocab().items()))
        return self._vocabulary_hash

    def _check_drafting(self, name: str, input_ids: torch.Tensor, settings: gen_config.Settings,
                        assistant: HotrodModel | None = None) -> None:
        """Drafting (argument `name`) runs greedy decoding or sampling of one row; the rest is refused."""
        if settings.num_beams > 1:
            raise HotrodError(f"{name} runs with greedy decoding or sampling, not beam search")
        if input_ids.shape[0] != 1 or settings.num_return_sequences > 1:
            raise HotrodError(f"{name} decodes one row at a time; got {input_ids.shape[0]}")
        for whose, model in (("this model's", self), ("the assistant's", assistant)):
            if model is not None and not model.backend.verifies_drafts:
                raise HotrodError(f"{name} needs backends that verify drafts in one pass; {whose} static engine "
                                  "steps one token at a time (load with static=False)")
        positions = assistant.dims.max_positions if assistant is not None else None
        if positions is not None and settings.max_length > positions:
            raise HotrodError(f"assistant_model has {positions} positions, fewer than the {settings.max_length} "
                              "this generation needs")

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
        """An encoder-decoder's first decoder token: the settings', else the model's config's."""
        start = settings.decoder_start_token_id
        return getattr(self.config, "decoder_start_token_id", None) if start is None else start

    # -- forward --------------------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(self, input_ids=None, attention_mask=None, token_type_ids=None, decoder_input_ids=None) -> ModelOutput:
        """One forward pass, with transformers' output fields: `.logits` for language models; for encoders,
        what the head returns (`.logits`, `.start_logits` / `.end_logits`), or `.last_hidden_state`."""
        with torch_threads(self.backend.loop_threads):
            return self._forward(input_ids, attention_mask, token_type_ids, decoder_input_ids)

    forward = __call__

    def _forward(self, input_ids, attention_mask, token_type_ids, decoder_input_ids) -> ModelOutput:
        # Outputs go where the inputs came from, as transformers' do (its inputs are on the model's device).
        device = input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
        input_ids = self._ids(input_ids)
        mask = torch.ones_like(input_ids) if attention_mask is None else self._as_long(attention_mask, input_ids.shape)
        if not self.spec.generates:
            types = torch.zeros_like(input_ids) if token_type_ids is None else self._types(token_type_ids, input_ids.shape)
            return ModelOutput(**self._encode(input_ids, mask, types, device))
        if not self.spec.encodes:
            return ModelOutput(logits=self._decoder_logits(input_ids, mask).to(device))
        if decoder_input_ids is None:
            raise HotrodError("an encoder-decoder forward needs decoder_input_ids")
        decoder_ids = self._ids(decoder_input_ids, check_length=False)
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
    def embed(self, texts_or_ids, pooling: str = "mean", normalize: bool = False, batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings [n, hidden] from the encoder's last hidden state.

        Inputs are sorted by length and run in sub-batches padded only to their own longest member, so
        mixed lengths do not pay for each other's padding; rows come back in the caller's order.
        """
        if pooling not in ("mean", "cls"):
            raise HotrodError(f"unknown pooling {pooling!r}; choose from mean, cls")
        if not self.spec.encodes:
            raise HotrodError(f"{self.config.model_type} is a decoder-only model; embed() needs an encoder")
        if self.task not in (tasks.FEATURES, tasks.TEXT2TEXT):
            raise HotrodError(f"this model ends in its {self.task} head, so it has no embeddings; build it with "
                              f"--task {tasks.FEATURES} (task=) for the bare encoder")
        if batch_size < 1:
            raise HotrodError(f"batch_size must be >= 1, got {batch_size}")
        rows = self._rows(texts_or_ids)
        result = torch.empty(len(rows), self.dims.hidden_size)
        with torch_threads(self.backend.loop_threads):
            for group in plan([len(r) for r in rows], batch_size):
                result[group] = self._embed_batch([rows[i] for i in group], pooling)
        return torch.nn.functional.normalize(result, dim=-1) if normalize else result

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
                width = max(len(r) for r in members)
                for row in members:
                    self._check_row(row.input_ids)
                ids = torch.tensor([r.input_ids + [pad] * (width - len(r)) for r in members], dtype=torch.long)
                mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in members], dtype=torch.long)
                types = torch.tensor([(r.token_type_ids or [0] * len(r)) + [0] * (width - len(r)) for r in members],
                                     dtype=torch.long)
                out = self._encode(ids, mask, types)
                for position, (index, row) in enumerate(zip(group, members)):
                    results[index] = {spec.name: out[spec.name][position, :len(row)] if "sequence" in spec.axes
                                      else out[spec.name][position] for spec in io.outputs}
        return results

    def classify(self, texts_or_pairs, top_k: int | None = 1, function_to_apply: str | None = None,
                 truncate: bool = False) -> list:
        """Labels and scores as transformers' `pipeline("text-classification")` gives them (`top_k=1`: as
        it answers without top_k; None: every label). Inputs: a text, a (text, text_pair) pair, or a list."""
        from hotrod.pipelines import classify

        prepared = classify.prepare(self, texts_or_pairs, top_k, function_to_apply, truncate)
        return classify.finish(self, prepared, self.run_rows(prepared.rows))

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None,
               truncate: bool = False) -> list[dict]:
        """Documents by a cross-encoder's score for (query, document), best first: [{"index", "score"}], the
        score as sentence-transformers' `CrossEncoder.predict` gives it (`hotrod.pipelines.rerank`)."""
        from hotrod.pipelines import rerank

        prepared = rerank.prepare(self, query, documents, top_n, truncate)
        return rerank.finish(self, prepared, self.run_rows(prepared.rows))

    def tag(self, texts: str | Sequence[str], aggregation_strategy: str = "simple",
            ignore_labels: Sequence[str] | str | None = ("O",), truncate: bool = False) -> list:
        """Entities as transformers' `pipeline("token-classification")` gives them, for aggregation none,
        simple, first, average or max: a list for one text, a list of lists for several."""
        from hotrod.pipelines import tag

        prepared = tag.prepare(self, texts, aggregation_strategy, ignore_labels, truncate)
        return tag.finish(self, prepared, self.run_rows(prepared.rows))

    def answer(self, question, context: str | None = None, top_k: int = 1, doc_stride: int | None = None,
               max_answer_len: int = 15, max_seq_len: int | None = None, max_question_len: int = 64,
               handle_impossible_answer: bool = False, align_to_words: bool = True) -> Any:
        """The answer span as transformers 4.x's `pipeline("question-answering")` gave it: {"answer",
        "score", "start", "end"} (a list of the top_k when top_k > 1, unless only one was found); several
        questions (a list, with one context or a list of them, or a list of (question, context) pairs) give
        one per question. Every window of a long context runs in one batch (`hotrod.pipelines.answer`)."""
        from hotrod.pipelines import answer

        prepared = answer.prepare(self, question, context, top_k, doc_stride, max_answer_len, max_seq_len,
                                  max_question_len, handle_impossible_answer, align_to_words)
        return answer.finish(self, prepared, self.run_rows(prepared.rows))

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
        for group in plan(lengths, max_batch=len(lengths), overhead=self.backend.call_overhead_tokens):
            width = lengths[group[-1]]
            feeds = {"input_ids": ids[group, :width], "attention_mask": mask[group, :width],
                     "token_type_ids": types[group, :width]}
            out = self.backend.run("encoder", feeds)
            for spec in io.outputs:
                value = self._host(out[spec.name], device).float()
                if "sequence" not in spec.axes:
                    result[spec.name][group] = value
                    continue
                real = mask[group, :width].to(value.device).reshape(len(group), width, *[1] * (value.dim() - 2))
                result[spec.name][group, :width] = value * real
        return result

    def _embed_batch(self, rows: list[list[int]], pooling: str) -> torch.Tensor:
        width = max(len(r) for r in rows)
        pad = self._pad_id()
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        out = self.backend.run("encoder", feeds)
        hidden = self._host(next(iter(out.values()))).float()
        if pooling == "cls":
            return hidden[:, 0]
        weights = mask[:, :, None].to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)

    def _rows(self, texts_or_ids) -> list[list[int]]:
        if isinstance(texts_or_ids, str):
            texts_or_ids = [texts_or_ids]
        if isinstance(texts_or_ids, torch.Tensor):
            texts_or_ids = texts_or_ids.tolist() if texts_or_ids.dim() == 2 else [texts_or_ids.tolist()]
        items = list(texts_or_ids)
        if items and all(isinstance(t, int) for t in items):  # one row of ids
            items = [items]
        if not items:
            raise HotrodError("nothing to embed")
        if all(isinstance(t, str) for t in items):
            if self.tokenizer is None:
                raise HotrodError("this model has no tokenizer; pass token ids instead of text")
            if any(not t.strip() for t in items):
                raise HotrodError("empty text")
            limit = self.dims.max_positions or None
            items = self.tokenizer(items, truncation=limit is not None, max_length=limit)["input_ids"]
        rows = [list(map(int, r)) for r in items]
        for row in rows:
            self._check_row(row)
        return rows

    # -- input checks ---------------------------------------------------------------------------

    def _ids(self, input_ids, check_length: bool = True) -> torch.Tensor:
        if input_ids is None:
            raise HotrodError("input_ids is required")
        try:
            ids = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError):
            raise HotrodError("input_ids must be a rectangular batch of token ids (pad shorter prompts)") from None
        if ids.dim() == 1:
            ids = ids[None, :]
        if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise HotrodError(f"input_ids must be a 2-D tensor of token ids, got shape {tuple(ids.shape)} {ids.dtype}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise HotrodError("empty prompt")
        ids = ids.long().cpu()
        if int(ids.min()) < 0 or int(ids.max()) >= self.dims.vocab_size:
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise HotrodError(f"token id {bad} is outside the vocabulary (0..{self.dims.vocab_size - 1})")
        if check_length and self.dims.max_positions is not None and ids.shape[1] > self.dims.max_positions:
            raise HotrodError(
                f"prompt of {ids.shape[1]} tokens is longer than the model's {self.dims.max_positions} positions"
            )
        return ids

    def _check_row(self, row: Sequence[int]) -> None:
        self._ids(torch.tensor([row], dtype=torch.long) if row else torch.zeros(1, 0, dtype=torch.long))

    @staticmethod
    def _as_long(tensor, shape) -> torch.Tensor:
        tensor = torch.as_tensor(tensor).long().cpu()
        if tensor.dim() == 1:
            tensor = tensor[None, :]
        if tuple(tensor.shape) != tuple(shape):
            raise HotrodError(f"mask shape {tuple(tensor.shape)} does not match input_ids {tuple(shape)}")
        return tensor

    def _types(self, token_type_ids, shape) -> torch.Tensor:
        """Token types within the model's table; a model without one (type_vocab_size 0) takes only zeros."""
        types = self._as_long(token_type_ids, shape)
        count = max(self.dims.type_vocab_size, 1)
        outside = types[(types < 0) | (types >= count)]
        if outside.numel():
            takes = f"token types 0 .. {count - 1}" if count > 1 else "token type 0 only"
            raise HotrodError(f"token_type_ids holds {int(outside[0])}, but this model takes {takes}")
        return types

    def _host(self, value, device: torch.device | None = None) -> torch.Tensor:
        """A backend output as the caller gets it: a torch tensor where the inputs were (the CPU unless
        the caller's tensors were on a GPU)."""
        return self.backend.to_torch(value).to(device or "cpu")

    def _pad_id(self) -> int:
        pad = getattr(self.config, "pad_token_id", None)
        return int(pad) if pad is not None else 0


def _draft_count(name: str, value: Any) -> int:
    """A number of tokens to draft a pass, from 1 to MAX_DRAFT_TOKENS (each is a position of the verifying pass)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DRAFT_TOKENS:
        raise HotrodError(f"{name} must be a whole number from 1 to {MAX_DRAFT_TOKENS}, got {value!r}")
    return value


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
