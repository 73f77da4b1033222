"""The rules of drafting (prompt lookup, an assistant model), stated once: `generate()` checks them, and the
server asks the same functions at its door (`hotrod.serve.checks`) and when it runs a request.

Drafting decodes one row greedily or by sampling, with tokens drafted a pass verified in one pass of the
model: beam search, several rows, or a backend that steps one token at a time (the static engine) cannot.
Every score processor hotrod implements (repetition penalty, min length, no-repeat n-grams, bad words,
forced first and last tokens, suppressed tokens) is a function of the row up to the position it chooses
for, which verification gives each drafted position (`Drafting.accept`): none makes drafts unverifiable,
so none is refused here; a processor that read anything else would have to be.
"""

from __future__ import annotations

from typing import Any

from hotrod.errors import HotrodError
from hotrod.generation.assist import DEFAULT_DRAFT_TOKENS
from hotrod.generation.drafts import MAX_DRAFT_TOKENS

NO_VERIFY = "its backend cannot verify drafts in one pass (the static engine steps one token at a time)"
BEAMS = "runs with greedy decoding or sampling, not beam search"


def draft_count(name: str, value: Any, least: int = 1) -> int:
    """A number of tokens to draft a pass, from `least` to MAX_DRAFT_TOKENS (each is a position of the
    verifying pass)."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_DRAFT_TOKENS:
        raise HotrodError(f"{name} must be a whole number from {least} to {MAX_DRAFT_TOKENS}, got {value!r}")
    return value


def refusal(num_beams: int, verifies: bool = True) -> str | None:
    """Why a request with `num_beams` on a backend that does (or does not) verify drafts cannot draft."""
    if num_beams > 1:
        return BEAMS
    if not verifies:
        return NO_VERIFY
    return None


def draft_arguments(model: Any, kwargs: dict) -> tuple[int, Any, int]:
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
        check_assistant(model, assistant)
    return (0 if lookup is None else draft_count("prompt_lookup_num_tokens", lookup), assistant,
            DEFAULT_DRAFT_TOKENS if assistant_tokens is None else draft_count("num_assistant_tokens", assistant_tokens))


def check_assistant(model: Any, assistant: Any) -> None:
    """An assistant drafts the model's tokens: a hotrod model of its kind, over the same vocabulary."""
    if not isinstance(assistant, type(model)):
        raise HotrodError(f"assistant_model must be a model loaded with hotrod.load, got {type(assistant).__name__}")
    if assistant.spec != model.spec:
        raise HotrodError(f"assistant_model is a model of kind {assistant.spec.name}; this model, of kind "
                          f"{model.spec.name}, takes drafts from a model of its own kind")
    if assistant.dims.vocab_size != model.dims.vocab_size:
        raise HotrodError(f"assistant_model has {assistant.dims.vocab_size} tokens in its vocabulary, this model "
                          f"{model.dims.vocab_size}: its drafts would not be this model's tokens")
    mine, theirs = model._vocabulary(), assistant._vocabulary()
    if mine is not None and theirs is not None and mine != theirs:
        raise HotrodError("assistant_model's tokenizer differs from this model's: its drafts would not be this "
                          "model's tokens")


def check_drafting(name: str, model: Any, rows: int, settings: Any, assistant: Any = None) -> None:
    """Drafting (argument `name`) runs greedy decoding or sampling of one row; the rest is refused."""
    if settings.num_beams > 1:
        raise HotrodError(f"{name} {BEAMS}")
    if rows != 1 or settings.num_return_sequences > 1:
        raise HotrodError(f"{name} decodes one row at a time; got {rows}")
    for whose, each in (("this model's", model), ("the assistant's", assistant)):
        if each is not None and not each.backend.verifies_drafts:
            raise HotrodError(f"{name} needs backends that verify drafts in one pass; {whose} static engine "
                              "steps one token at a time (load with static=False)")
    positions = assistant.dims.max_positions if assistant is not None else None
    if positions is not None and settings.max_length > positions:
        raise HotrodError(f"assistant_model has {positions} positions, fewer than the {settings.max_length} "
                          "this generation needs")
