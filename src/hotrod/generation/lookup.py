"""Prompt lookup decoding: drafts copied from the text so far, verified in one pass of the model.

Outputs that copy from their inputs (summaries, extraction, code edits, answers quoting a document)
repeat n-grams of the prompt. After each token, the last n tokens (n from `MAX_NGRAM` down to 1) are
looked up earlier in the row; the tokens that followed the latest earlier occurrence are the draft, which
the model verifies in one pass (`hotrod.generation.drafts`). A single token is looked up in the prompt
only: one token recurring in the output itself (a digit, a space) is weak evidence of a copy, and its
drafts were rejected nearly always (the demo GPT-2 writing number words in digits: 4 of 70 drafted
tokens kept, every verifying pass lost), while in the prompt it is where the copying resumes (the demo
GPT-2 rewriting a sentence's numbers: 46% of drafted tokens kept when such drafts came from anywhere in
the row, 52% from the prompt only). Greedy, the tokens are greedy decoding's;
sampling, they follow plain sampling's distribution, from another sequence of draws of torch's generator.

A draft that is rejected outright cost a wider pass for one token; after two in a row, the row drafts
again only after `backoff` plain steps (doubling up to `MAX_BACKOFF` while drafts keep failing, reset by
a hit), so text that never repeats decodes at plain decoding's pace.
"""

from __future__ import annotations

import torch

from hotrod.generation.config import Settings
from hotrod.generation.drafts import Drafting
from hotrod.generation.state import DecodingState

MAX_NGRAM = 3  # the longest tail looked up (transformers' prompt lookup default, max_matching_ngram_size 2..3)
MAX_BACKOFF = 16
# New positions from which `Drafter._index` updates by slices: for one token a step the n-gram-at-a-time
# loop is the cheaper (it builds no slices), for a prompt the slices (a dict update each, not a loop a token).
BULK_INDEX = 5


def find_draft(tokens: list[int], length: int, prompt: int = 0) -> list[int]:
    """Up to `length` tokens that followed the latest earlier occurrence of the row's last n tokens; a
    single token's within the row's first `prompt` tokens when it has a prompt (`prompt` > 0)."""
    for n in range(min(MAX_NGRAM, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        last = min(prompt, len(tokens) - 1) - 1 if n == 1 and prompt else len(tokens) - n - 1
        for start in range(last, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + length]
    return []


Gram = tuple[int, ...]


class Drafter:
    """One row's prompt lookup: at most `tokens` drafted a step, paused after a draft rejected outright
    (`backoff` plain steps, doubling up to `MAX_BACKOFF` while drafts keep failing). `prompt`: how many of
    the row's first tokens are its prompt, where alone a single token is looked up (0: anywhere). Drafts come from an
    index of the row's n-grams, brought up to date with the tokens that arrived since the last step, so a
    step costs the same at token 10 as at token 2,000; `find_draft` (the definition) would scan the whole
    row every step. Both give the same drafts (tests/serve/test_speculate.py). The generating loop and the
    server's running batch both draft with it."""

    def __init__(self, tokens: int, prompt: int = 0):
        self.tokens, self.prompt = tokens, prompt
        self.backoff, self.wait = 1, 0
        self.failed = 0  # drafts rejected outright in a row
        # Each n-gram's latest start, n from 1 to MAX_NGRAM in one dict (tuples of other lengths never meet).
        self._latest: dict[Gram, int] = {}
        self._indexed = 1  # n-grams ending before this position are in `_latest`
        # A single token's latest start within the prompt, where it is looked up when the row has one.
        self._in_prompt: dict[Gram, int] = {} if prompt else self._latest

    def draft(self, row: list[int], room: int) -> list[int]:
        """Up to `room` tokens that followed the latest earlier occurrence of the end of `row` (the
        request's whole text so far, which only grows); none while paused."""
        if self.wait:
            self.wait -= 1
            return []
        if room <= 0:
            return []
        if len(row) > self._indexed:
            self._index(row)
        tail = tuple(row[-MAX_NGRAM:])
        for n in range(min(MAX_NGRAM, len(row) - 1), 0, -1):
            start = (self._latest if n > 1 else self._in_prompt).get(tail[-n:])
            if start is not None:
                return row[start + n : start + n + min(self.tokens, room)]
        return []

    def judged(self, kept: int) -> None:
        """A draft was verified and `kept` of its tokens accepted. A second draft in a row with none kept
        pauses drafting, a first does not: a copy that resumes after a correction (a number written
        another way) is found again at once, while text that never repeats still pauses."""
        if kept:
            self.backoff, self.failed = 1, 0
            return
        self.failed += 1
        if self.failed > 1:
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)

    def _index(self, row: list[int]) -> None:
        """Index the n-grams that end before the row's last token (the one ending there is the tail looked
        up, which must have occurred earlier); a later start overwrites an earlier one. Many at once (a
        prompt) by dict updates over the row's slices: one n-gram at a time, a prompt's Python loop would
        cost every generate() call a step's worth of overhead."""
        done, last = self._indexed, len(row) - 1  # n-grams ending at `done` .. `last` (exclusive ends)
        if last - done + 1 < BULK_INDEX:
            for end in range(done, last + 1):
                grams = tuple(row[max(0, end - MAX_NGRAM) : end])
                for n in range(1, len(grams) + 1):
                    self._latest[grams[-n:]] = end - n
                if end <= self.prompt:
                    self._in_prompt[grams[-1:]] = end - 1
        else:
            for n in range(1, MAX_NGRAM + 1):
                first = max(done - n, 0)  # the starts of those n-grams: first .. last - n
                part = row[first:last]
                self._latest.update(zip(zip(*(part[i:] for i in range(n))), range(first, last - n + 1)))
            if self.prompt and done <= self.prompt:
                self._in_prompt.update(((row[start],), start) for start in range(done - 1, min(last, self.prompt)))
        self._indexed = len(row)


class Lookup(Drafting):
    """Prompt lookup decoding (greedy or sampled) of one row (`generate(prompt_lookup_num_tokens=N)`)."""

    def __init__(self, state: DecodingState, settings: Settings, draft_tokens: int):
        super().__init__(state, settings)
        self.draft_tokens = draft_tokens
        self.drafter = Drafter(draft_tokens)  # made again for each row, knowing its prompt (`begin`)
        # An encoder-decoder's input, then what it decoded after its start token: the text drafts are looked
        # up in, grown as tokens arrive (None: a decoder-only model's own row, which begins with its prompt).
        self.row: list[int] | None = None
        self.source = 0  # how many of `row`'s first tokens are the input

    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: list[int]) -> None:
        # An encoder-decoder's output copies from its input, which its decoder never holds: drafts are
        # looked up in the input, then in what was decoded after the start token.
        if self.state.sequences_include_prompt:
            self.row, prompt = None, len(tokens)
        else:
            self.row = input_ids[0][attention_mask[0].bool()].tolist()
            prompt, self.source = len(self.row), len(self.row)
        self.drafter = Drafter(self.draft_tokens, prompt=prompt)

    def draft(self, tokens: list[int], room: int) -> list[int]:
        row = self.row
        if row is None:
            return self.drafter.draft(tokens, room)
        row.extend(tokens[1 + len(row) - self.source:])  # the decoded tokens it lacks (after the start token)
        return self.drafter.draft(row, room)

    def verified(self, drafted: int, kept: int) -> None:
        self.drafter.judged(kept)
