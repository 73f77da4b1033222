"""Assisted decoding: drafts from a smaller model of the same vocabulary, verified in one pass of the model.

The assistant decodes the same row in a decoding state of its own and drafts up to N tokens; the model
verifies them in one pass (`hotrod.generation.drafts`). Neither cache is copied: the model's gives back
its rejected positions, and before each draft the assistant's gives back what it holds past the tokens
the model kept (`rewind`), then reads what it lacks: the model's own token after the kept draft, and the
last drafted token when the whole draft was kept (the assistant never read it), in one pass.

Greedy, the assistant drafts its argmax tokens and a draft is kept while the model's argmax agrees: the
tokens are greedy decoding's, whatever the assistant. Sampling follows transformers' speculative sampling
(Leviathan et al. 2023, algorithm 1): the assistant draws each draft token from its own processed
distribution q, the model keeps it with probability min(1, p/q) for its own processed distribution p,
and at the first rejection draws from max(0, p - q) renormalised (after a whole draft, from p). Every
token then follows the model's sampling distribution exactly; drafts drawn greedily would not (q would
not be what they came from).

N follows transformers' "heuristic" schedule: +2 after a draft kept whole, -1 (to at least 1) after any
other. A draft costs one assistant step per token and the steps after a rejection are wasted, while the
model's verifying pass costs little more for a few more positions (decoding is memory bound: each
weight is read once for all of them): an assistant that agrees drafts longer, one that does not wastes
fewer steps. Like transformers' "heuristic_transient", N starts from `num_assistant_tokens` at every
call, so that a call's draws, hence its sampled tokens for a seed, never depend on the calls before it.
"""

from __future__ import annotations

import torch

from hotrod.generation.config import Settings
from hotrod.generation.drafts import MAX_DRAFT_TOKENS, Drafting
from hotrod.generation.sampling import process
from hotrod.generation.state import DecodingState

DEFAULT_DRAFT_TOKENS = 5  # transformers' first draft length under its heuristic schedule (its default now: 20, constant)


def distribution(logits: torch.Tensor, tokens: list[int], s: Settings, skip: torch.Tensor | None) -> torch.Tensor:
    """The probabilities [vocab] sampling draws the token after `tokens` from: processed scores (the first
    `skip` tokens, padding, left out of the repetition penalty), softmaxed."""
    return torch.softmax(process(logits, torch.tensor([tokens]), s, skip), dim=-1)[0]


def draw(weights: torch.Tensor) -> int:
    """One token drawn in proportion to `weights` (non-negative, not necessarily summing to one)."""
    return int(torch.multinomial(weights, num_samples=1))


class Assist(Drafting):
    """Assisted decoding (greedy or sampled) of one row (`generate(assistant_model=...)`): `assistant` is
    the assistant's fresh decoding state, of the model's kind."""

    def __init__(self, state: DecodingState, settings: Settings, assistant: DecodingState,
                 draft_tokens: int = DEFAULT_DRAFT_TOKENS):
        super().__init__(state, settings)
        self.assistant, self.n = assistant, draft_tokens
        self.held = 0  # leading tokens of the row in the assistant's cache (as drafted: maybe not kept)
        self.q: list[torch.Tensor] = []  # sampling: the distribution each draft token was drawn from

    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: list[int]) -> None:
        self.assistant.start(input_ids, attention_mask, 1)
        self.held = len(tokens)

    def draft(self, tokens: list[int], room: int) -> list[int]:
        # The model kept the assistant's tokens up to its own last choice, which the assistant lacks.
        agreed = min(self.held, len(tokens) - 1)
        self.assistant.rewind(self.held - agreed)
        logits = self._read(tokens[agreed:])
        self.held = len(tokens)
        eos = set(self.s.eos_token_ids or [])
        draft: list[int] = []
        self.q = []
        while True:
            token = self._draw(logits, tokens + draft)
            draft.append(token)
            if len(draft) >= min(self.n, room) or token in eos:
                return draft
            logits = self.assistant.step(torch.tensor([token]))
            self.held += 1

    def _read(self, missing: list[int]) -> torch.Tensor:
        """Feed the assistant the row's tokens it lacks (one or two): its logits after the last."""
        if len(missing) == 1:
            return self.assistant.step(torch.tensor(missing))
        return self.assistant.verify(torch.tensor([missing]))[:, -1]

    def _draw(self, logits: torch.Tensor, tokens: list[int]) -> int:
        if not self.s.do_sample:
            return self.choose(logits, tokens)
        q = distribution(logits, tokens, self.s, self.padding)
        self.q.append(q)
        return draw(q)

    def accept(self, every: torch.Tensor, tokens: list[int], draft: list[int]) -> tuple[list[int], int]:
        if not self.s.do_sample:
            return super().accept(every, tokens, draft)
        kept: list[int] = []
        for j, drafted in enumerate(draft):
            p = distribution(every[:, j], tokens + kept, self.s, self.padding)
            q = self.q[j].to(p.device)
            if float(torch.rand(())) * float(q[drafted]) < float(p[drafted]):  # kept with probability min(1, p/q)
                kept.append(drafted)
                continue
            residual = (p - q).clamp(min=0)
            return kept, draw(residual if float(residual.sum()) > 0 else p)
        return kept, draw(distribution(every[:, len(draft)], tokens + kept, self.s, self.padding))

    def verified(self, drafted: int, kept: int) -> None:
        self.n = min(self.n + 2, MAX_DRAFT_TOKENS) if kept == drafted else max(1, self.n - 1)
