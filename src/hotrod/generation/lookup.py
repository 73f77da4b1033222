"""Prompt lookup decoding: drafts copied from the text so far, verified in one pass of the model.

Outputs that copy from their inputs (summaries, extraction, code edits, answers quoting a document)
repeat n-grams of the prompt. After each token, the last n tokens (n from `MAX_NGRAM` down to 1) are
looked up earlier in the row; the tokens that followed the latest earlier occurrence are the draft. The
model reads the new token and the draft in one pass over its in-place cache (`DecoderState.verify`) and
gives the logits after each; the draft is kept up to its first token that decoding would not have chosen,
which is replaced by the one it chose (so every pass yields at least one token), and the cache gives back
the rejected positions by the row's length alone (`rewind`). Greedy, the tokens are greedy decoding's.
Sampling, each position is drawn from the model's processed distribution given the tokens kept before it,
and the draft is kept while the draws match it, as transformers' prompt lookup does: the output follows
plain sampling's distribution, from another sequence of draws of torch's generator.

A draft that is rejected outright cost a wider pass for one token; after one, the row drafts again only
after `backoff` plain steps (doubling up to `MAX_BACKOFF` while drafts keep failing, reset by a hit), so
text that never repeats decodes at plain decoding's pace.
"""

from __future__ import annotations

import torch

from hotrod.generation.config import Settings
from hotrod.generation.search import pick

MAX_NGRAM = 3  # the longest tail looked up (transformers' prompt lookup default, max_matching_ngram_size 2..3)
MAX_BACKOFF = 16


def find_draft(tokens: list[int], length: int) -> list[int]:
    """Up to `length` tokens that followed the latest earlier occurrence of the row's last n tokens."""
    for n in range(min(MAX_NGRAM, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + length]
    return []


class Lookup:
    """Prompt lookup decoding (greedy or sampled) of one row (`generate(prompt_lookup_num_tokens=N)`); it counts the
    drafted and accepted tokens (`drafted`, `accepted`)."""

    def __init__(self, state, settings: Settings, draft_tokens: int):
        self.state, self.s, self.n = state, settings, draft_tokens
        self.drafted = self.accepted = 0
        self.backoff, self.wait = 1, 0
        self.source: list[int] = []  # looked up before the row's own tokens
        self.skip = 0  # leading tokens of the row left out of the lookup (a decoder's start token)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        sequences, logits = self.state.start(input_ids, attention_mask, 1)
        tokens = sequences[0].tolist()
        # An encoder-decoder's output copies from its input, which its decoder never holds: drafts are
        # looked up in the input, then in what was decoded after the start token.
        if not self.state.sequences_include_prompt:
            self.source, self.skip = input_ids[0][attention_mask[0].bool()].tolist(), 1
        eos = set(self.s.eos_token_ids or [])
        while True:
            token = int(pick(logits, torch.tensor([tokens]), self.s)[0])
            tokens.append(token)
            if token in eos or len(tokens) >= self.s.max_length:
                return torch.tensor([tokens])
            draft = self._draft(tokens)
            if not draft:
                logits = self.state.step(torch.tensor([token]))
                continue
            logits, kept = self._check(tokens, draft)
            ended = next((i for i, t in enumerate(kept) if t in eos), None)
            if ended is not None:
                return torch.tensor([tokens + kept[: ended + 1]])
            tokens += kept

    def _draft(self, tokens: list[int]) -> list[int]:
        if self.wait:
            self.wait -= 1
            return []
        room = self.s.max_length - len(tokens) - 1  # the pass also yields the token after the draft
        return find_draft(self.source + tokens[self.skip:], min(self.n, room)) if room > 0 else []

    def _check(self, tokens: list[int], draft: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Verify `draft` after the last token: the drafted tokens kept, and the logits after the last kept."""
        every = self.state.verify(torch.tensor([[tokens[-1], *draft]]))
        kept: list[int] = []
        for j, drafted in enumerate(draft):
            if int(pick(every[:, j], torch.tensor([tokens + kept]), self.s)[0]) != drafted:
                break
            kept.append(drafted)
        self.drafted += len(draft)
        self.accepted += len(kept)
        self.state.rewind(len(draft) - len(kept))
        self._pace(len(kept))
        return every[:, len(kept)], kept

    def _pace(self, kept: int) -> None:
        if kept:
            self.backoff = 1
        else:
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)
