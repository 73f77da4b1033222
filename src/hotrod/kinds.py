"""The three kinds of model, each as one small spec: what generic code asks of a kind, answered here once.

As Optimum describes each architecture in one declarative object, hotrod describes each kind (encoder,
decoder-only, encoder-decoder) by what it does: whether it generates, whether it has an encoder, whether
generated rows continue the prompt (so prompts pad on the left and count against the position limit) or
begin with a start token, which graphs it exports, which decoding state runs it and which layers hold
the self-attention cache. The decoding loop, the server, verification, calibration and the benchmark
read these answers; nothing outside this module and `hotrod.models` compares a kind's name. Families say
which kind they are (`hotrod.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hotrod.contracts import GraphIO, graph_contracts
from hotrod.errors import HotrodError, check_choice
from hotrod.generation.cache import DecoderState, Seq2SeqState
from hotrod.generation.state import DecodingState
from hotrod.registry import Dims, Kind


@dataclass(frozen=True)
class KindSpec:
    name: Kind
    generates: bool  # has generate(); served with continuous batching (else with dynamic batching)
    encodes: bool  # has an encoder: embed() applies, and a forward reads encoder inputs
    continues_prompt: bool  # generated rows begin with the prompt (else with the decoder's start token)
    auto_class: str  # transformers' auto class of its bare model (the benchmark's baseline)

    @property
    def pads_left(self) -> bool:
        """Prompts of a batch are left-padded: each row's new tokens then follow its last prompt token."""
        return self.continues_prompt

    @property
    def infers_padding(self) -> bool:
        """generate() without a mask infers one from the pad token, as transformers does for these only."""
        return self.continues_prompt

    @property
    def step_graph(self) -> str | None:
        """The graph that runs every decoding step (a token or a draft a row), where the kind generates: the
        graph whose nodes run most often, once per token."""
        return "decoder" if self.generates else None

    def contracts(self, dims: Dims) -> dict[str, GraphIO]:
        """The graphs every family of this kind exports, and their inputs and outputs."""
        return graph_contracts(self.name, dims)

    def new_state(self, backend: Any, dims: Dims, start_token: int | None, capacity: int) -> DecodingState:
        """A fresh decoding state over `backend` with room for `capacity` positions per row; an encoder-decoder
        starts each row with `start_token`, which it must have."""
        if not self.generates:
            raise HotrodError(f"a model of kind {self.name} does not generate")
        if not self.encodes:
            return DecoderState(backend, dims, capacity=capacity)
        if start_token is None:
            raise HotrodError("neither decoder_start_token_id nor bos_token_id is set in the model's configs; pass "
                              "decoder_start_token_id to generate()")
        return Seq2SeqState(backend, dims, start_token, capacity=capacity)

    def cache_layers(self, dims: Dims) -> int:
        """Layers that hold a self-attention cache while generating: the decoder's."""
        return dims.num_decoder_layers if self.encodes else dims.num_layers

    def room(self, new_tokens: int) -> int:
        """Positions a prompt must leave free for `new_tokens` (they share the prompt's positions or not)."""
        return new_tokens if self.continues_prompt else 0

    def decoder_prompt(self, prompt_tokens: int) -> int:
        """Tokens the decoder holds before its first new token: the prompt, or the start token."""
        return prompt_tokens if self.continues_prompt else 1

    def needs_positions(self, prompt_tokens: int, new_tokens: int) -> int:
        """Positions of the model's limit that a prompt and its new tokens take: one sequence for a
        decoder-only model; for an encoder-decoder, the longer of the input and the decoder's own."""
        if not self.generates or self.continues_prompt:
            return prompt_tokens + self.room(new_tokens)
        return max(prompt_tokens, self.decoder_prompt(prompt_tokens) + new_tokens)

    def prompt_span(self, length: int, width: int) -> slice:
        """Where a row's `length` tokens sit in a batch `width` wide."""
        return slice(width - length, width) if self.pads_left else slice(0, length)

    def generated(self, sequences: torch.Tensor, prompt_length: int) -> torch.Tensor:
        """The new tokens of `generate()`'s output rows (after the prompt, or after the start token)."""
        return sequences[..., prompt_length if self.continues_prompt else 1:]

    def history(self, prompt: list[int], generated: list[int], start_token: int | None) -> list[int]:
        """A row as the decoding loop holds it: prompt (or start token) and what has been generated."""
        return (prompt if self.continues_prompt else [start_token]) + generated


KINDS: dict[str, KindSpec] = {spec.name: spec for spec in (
    KindSpec("encoder", generates=False, encodes=True, continues_prompt=False, auto_class="AutoModel"),
    KindSpec("decoder", generates=True, encodes=False, continues_prompt=True, auto_class="AutoModelForCausalLM"),
    KindSpec("seq2seq", generates=True, encodes=True, continues_prompt=False, auto_class="AutoModelForSeq2SeqLM"),
)}


def names(where: Callable[[KindSpec], bool]) -> tuple[str, ...]:
    """The kinds `where` accepts, in the table's order."""
    return tuple(name for name, kind in KINDS.items() if where(kind))


def spec(kind: str) -> KindSpec:
    """The spec of `kind`; an unknown name is one line that lists the known ones."""
    return KINDS[check_choice("model kind", kind, tuple(KINDS))]
