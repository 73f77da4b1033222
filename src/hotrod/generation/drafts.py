"""Decoding one row with drafts verified in one pass: the loop that prompt lookup and assisted decoding share.

A drafter proposes tokens to follow the row (`Drafting.draft`). The model reads the row's last token and
the draft in one pass over its in-place cache (`DecoderState.verify`) and gives the logits after each;
`Drafting.accept` keeps a prefix of the draft and chooses the token after it from those logits, so every
pass yields at least one token; the cache gives back the rejected positions by the row's length alone
(`rewind`), so nothing is copied. Drafters differ in where their drafts come from and, when sampling, in
how a draft is accepted; the loop, the bookkeeping and the end of a row are here once.
"""

from __future__ import annotations

import numpy as np
import torch

from hotrod.generation.config import Settings
from hotrod.generation.feeds import on_host
from hotrod.generation.sampling import argmax_ids, plain_argmax
from hotrod.generation.search import HostScores, greedy, greedy_only, pick, prompt_padding
from hotrod.generation.state import DecodingState

MAX_DRAFT_TOKENS = 64  # drafted tokens a pass at most: each is a position of the verifying pass


def _ids(tokens: list) -> np.ndarray:
    """Token ids (a step's [token], a pass's [[token, *draft]], the finished row) as an int64 numpy array,
    which a state takes as it is: a torch tensor would cost its making (torch.tensor of a list several
    times numpy's), and the state's asking it for its memory, at every pass."""
    return np.array(tokens, dtype=np.int64)


class Drafting:
    """Greedy or sampled decoding of one row with drafts; it counts the drafted and accepted tokens
    (`drafted`, `accepted`). Subclasses say where drafts come from (`draft`)."""

    def __init__(self, state: DecodingState, settings: Settings):
        self.state, self.s = state, settings
        self.drafted = self.accepted = 0
        self.padding: torch.Tensor | None = None  # the row's leading padding, which the repetition penalty ignores
        self._host = HostScores()  # a step's logits lent to numpy
        self._host_passes = HostScores()  # a pass's (a buffer of their own, as wide as the pass)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        sequences, logits = self.state.start(input_ids, attention_mask, 1)
        tokens = on_host(sequences[0]).tolist()
        self.padding = prompt_padding(self.state, attention_mask, 1, self.s)
        self.begin(input_ids, attention_mask, tokens)
        eos, limit = set(self.s.eos_token_ids or []), self.s.max_length
        new = [self.choose(logits, tokens)]
        while True:
            for token in new:
                tokens.append(token)
                if token in eos or len(tokens) >= limit:
                    return torch.from_numpy(_ids([tokens]))
            room = limit - len(tokens) - 1  # the pass also yields the token after the draft
            draft = self.draft(tokens, room) if room > 0 else []
            if draft:
                new = self._check(tokens, draft)
            else:
                new = [self.choose(self.state.step(_ids([tokens[-1]])), tokens)]

    def _check(self, tokens: list[int], draft: list[int]) -> list[int]:
        """Verify `draft` after the last token: the drafted tokens kept, then the token the model chose after them."""
        every = self.state.verify(_ids([[tokens[-1], *draft]]))
        kept, token = self.accept(every, tokens, draft)
        self.state.rewind(len(draft) - len(kept))
        self.drafted += len(draft)
        self.accepted += len(kept)
        self.verified(len(draft), len(kept))
        return [*kept, token]

    def choose(self, logits: torch.Tensor, tokens: list[int]) -> int:
        """The token decoding without drafts would take after `tokens`: the processed argmax, or a draw."""
        if plain_argmax(self.s, len(tokens)):  # no tensor of the row to make: it costs more than a small step
            scores = self._host(logits)
            return argmax_ids(logits)[0] if scores is None else scores[0].argmax().item()
        if greedy_only(self.s):  # EOS held back (min_length): nor here, where only the row's length counts
            return greedy(logits, self.s, len(tokens)).tolist()[0]
        return int(pick(logits, torch.tensor([tokens]), self.s, self.padding)[0])

    def accept(self, every: torch.Tensor, tokens: list[int], draft: list[int]) -> tuple[list[int], int]:
        """The draft up to its first token that decoding would not have chosen, and the token chosen there
        (or after the whole draft). Greedy, these are greedy decoding's tokens. Sampling, each position is
        drawn given the tokens kept before it and the draft is kept while the draws match it, as
        transformers' prompt lookup does: the draw that differs is the next token, so every token follows
        plain sampling's distribution."""
        if plain_argmax(self.s, len(tokens)):  # every position's choice at once
            scores = self._host_passes(every)
            choices = argmax_ids(every)[0] if scores is None else scores[0].argmax(axis=-1).tolist()
            agreed = 0
            for choice, drafted in zip(choices, draft):  # a plain loop: a generator's frame costs more here
                if choice != drafted:
                    break
                agreed += 1
            return draft[:agreed], choices[agreed]
        kept: list[int] = []
        for j, drafted in enumerate(draft):
            token = self.choose(every[:, j], tokens + kept)
            if token != drafted:
                return kept, token
            kept.append(drafted)
        return kept, self.choose(every[:, len(draft)], tokens + kept)

    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: list[int]) -> None:
        """The row has started (`tokens`: what the state holds); a drafter prepares its source."""

    def draft(self, tokens: list[int], room: int) -> list[int]:
        """Up to `room` tokens to follow `tokens` (none: the model steps one token)."""
        raise NotImplementedError

    def verified(self, drafted: int, kept: int) -> None:
        """A draft of `drafted` tokens was verified and `kept` of them were kept: a drafter paces itself."""
