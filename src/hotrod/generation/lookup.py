"""Prompt lookup decoding: drafts copied from the text so far, verified in one pass of the model.

Outputs that copy from their inputs (summaries, extraction, code edits, answers quoting a document)
repeat n-grams of the prompt. After each token, the last n tokens (n from `MAX_NGRAM` down to 1) are
looked up earlier in the row; the tokens that followed the latest earlier occurrence are the draft, which
the model verifies in one pass (`hotrod.generation.drafts`). Greedy, the tokens are greedy decoding's;
sampling, they follow plain sampling's distribution, from another sequence of draws of torch's generator.

A draft that is rejected outright cost a wider pass for one token; after one, the row drafts again only
after `backoff` plain steps (doubling up to `MAX_BACKOFF` while drafts keep failing, reset by a hit), so
text that never repeats decodes at plain decoding's pace.
"""

from __future__ import annotations

import torch

from hotrod.generation.cache import DecodingState
from hotrod.generation.config import Settings
from hotrod.generation.drafts import Drafting

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


class Lookup(Drafting):
    """Prompt lookup decoding (greedy or sampled) of one row (`generate(prompt_lookup_num_tokens=N)`)."""

    def __init__(self, state: DecodingState, settings: Settings, draft_tokens: int):
        super().__init__(state, settings)
        self.n = draft_tokens
        self.backoff, self.wait = 1, 0
        self.source: list[int] = []  # looked up before the row's own tokens
        self.skip = 0  # leading tokens of the row left out of the lookup (a decoder's start token)

    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: list[int]) -> None:
        # An encoder-decoder's output copies from its input, which its decoder never holds: drafts are
        # looked up in the input, then in what was decoded after the start token.
        if not self.state.sequences_include_prompt:
            self.source, self.skip = input_ids[0][attention_mask[0].bool()].tolist(), 1

    def draft(self, tokens: list[int], room: int) -> list[int]:
        if self.wait:
            self.wait -= 1
            return []
        return find_draft(self.source + tokens[self.skip:], min(self.n, room))

    def verified(self, drafted: int, kept: int) -> None:
        if kept:
            self.backoff = 1
        else:
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)
