"""What the decoding loop asks of a generation's state, whatever the kind of model behind it.

A state turns the kind's graph contract into three calls the decoding loop needs: `start` (prefill,
or encode and first decoder step), `step` (one token per row) and `reorder` (beam search). The cache
stays with the backend throughout; only the last-position logits come back as torch tensors. For
continuous batching, `join` appends the rows of another started state, `place` writes new rows into free
slots, `release` turns finished rows into free slots and `keep` drops rows. Each copies cache rows once
per arrival or departure, never per step. The states themselves are in `hotrod.generation.cache`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch


class DecodingState(Protocol):
    sequences_include_prompt: bool  # rows start with the prompt (decoder-only) or a start token (seq2seq)

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, expand: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (initial sequences, next-token logits), each row repeated `expand` times."""

    def step(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Feed one token per row (a tensor, or numpy ids on the host); returns next-token logits [rows,
        vocab], which the next call to the state may overwrite (a backend that writes outputs where it is
        told writes them into a buffer of the state's own)."""

    def chain(self, tokens: torch.Tensor, steps: int, pick: Any) -> torch.Tensor | None:
        """`steps` greedy steps in one backend call, each fed the choice (`pick`, as `Backend.chain` takes it)
        of the step before (the first: `tokens`): the tokens chosen [rows, steps], or None where the backend
        runs one step a call."""

    def reorder(self, index: torch.Tensor) -> None:
        """Keep cache rows `index` (beam search)."""

    def join(self, others: list[DecodingState], positions: int = 0) -> None:
        """Append the rows of `others`, in order: started states of the same model. The joined buffers
        hold at least `positions` per row (what the rows will need, when the parts hold less); joining
        no others only sizes the state's own buffers so."""

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (the others have finished)."""

    def room_for(self, other: DecodingState) -> bool:
        """Whether rows of `other` can take free slots of this state (see `place`)."""

    def place(self, other: DecodingState, pairs: list[tuple[int, int]]) -> None:
        """For each (slot, row): row `row` of `other` overwrites row `slot` of this state, in place.

        The slot's row has left; the new row's cache is copied at its own length. This costs the new
        row's bytes alone, where `join` copies the whole batch.
        """

    def reserve(self, positions: int) -> None:
        """Make room for rows of `positions` cache positions (before `start`, or before `place`)."""

    def release(self, rows: list[int]) -> None:
        """Rows `rows` have left: keep them as cheap free slots until `place` reuses them."""

    def fit(self, positions: int) -> None:
        """The rows left need at most `positions` each: give back memory held for rows that have gone."""

    def verify(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Run `tokens` [rows, k] (a tensor, or numpy ids on the host) after each row's cache in one pass: the
        logits after each [rows, k, vocab], which the next pass may overwrite (as a step's)."""

    def rewind(self, positions: int | torch.Tensor) -> None:
        """Give back each row's last `positions` cached positions (a count, or one per row)."""

    def recycle(self, spare: DecodingState) -> None:
        """Start (`start`) in the buffers of `spare`, a finished generation's state of the same model, where
        they fit: zeroed, as new ones, without their making and binding."""

    def finish(self) -> None:
        """The generation is over: let go of what only it used (an encoder-decoder's cross K/V), keeping the
        buffers a later state may `recycle`."""

    def nbytes(self) -> int:
        """The bytes of the buffers the state holds for its generation (0 before `start`)."""

    @property
    def headroom(self) -> int:
        """Positions the longest row may still take before the buffers must grow."""
