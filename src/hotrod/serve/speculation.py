"""Speculative decoding in the running batch: each request's prompt-lookup drafts and how they fared.

A request that asks for it (`"speculate": {"prompt_lookup": N}`, or the server's `--speculate`) drafts up to
N tokens a step from its own text, as `generate(prompt_lookup_num_tokens=N)` does
(`hotrod.generation.lookup`): the tokens that followed the latest earlier occurrence of its last 3, 2 or 1
tokens. The runner verifies the drafts of every row in one pass of the batch and keeps each draft up to
the first token decoding would not have chosen (`GenerationRunner.step`). A draft rejected outright
pauses the request's drafting for a while, doubling while drafts keep failing, so that text which never
repeats decodes at plain decoding's pace.

The state is the request's own (`RowOptions.drafter`), never the scheduler's. Drafts come from an index
of the request's n-grams, brought up to date with the tokens that arrived since the last step, so a step
costs the same at token 10 as at token 2,000; `find_draft` would scan every row's whole text at every
step. Both give the same drafts (tests/serve/test_speculate.py).
"""

from __future__ import annotations

from typing import Any

from hotrod.generation.lookup import MAX_BACKOFF, MAX_NGRAM

Gram = tuple[int, ...]


class Drafter:
    """One request's prompt lookup: at most `tokens` drafted a step, with `generate()`'s backoff."""

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.backoff, self.wait = 1, 0
        self._latest: list[dict[Gram, int]] = [{} for _ in range(MAX_NGRAM)]  # n-gram -> its latest start
        self._indexed = 1  # n-grams ending before this position are in `_latest`

    def draft(self, row: list[int], room: int) -> list[int]:
        """Up to `room` tokens that followed the latest earlier occurrence of the end of `row` (the
        request's whole text so far, which only grows); none while paused."""
        if self.wait:
            self.wait -= 1
            return []
        if room <= 0:
            return []
        self._index(row)
        for n in range(min(MAX_NGRAM, len(row) - 1), 0, -1):
            start = self._latest[n - 1].get(tuple(row[-n:]))
            if start is not None:
                return row[start + n : start + n + min(self.tokens, room)]
        return []

    def judged(self, kept: int) -> None:
        """A draft was verified and `kept` of its tokens accepted: none pauses drafting."""
        if kept:
            self.backoff = 1
        else:
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)

    def _index(self, row: list[int]) -> None:
        """Index the n-grams that end before the row's last token (the one ending there is the tail looked
        up, which must have occurred earlier); a later start overwrites an earlier one."""
        for end in range(self._indexed, len(row)):
            for n in range(1, min(MAX_NGRAM, end) + 1):
                self._latest[n - 1][tuple(row[end - n : end])] = end - n
        self._indexed = max(self._indexed, len(row))


def agreed(draft: list[int], chosen: list[int]) -> list[int]:
    """A greedy row's tokens from one verifying pass: `chosen[j]` is its choice after the last token and
    the first j drafted ones; the draft is kept while the choices agree, then the first choice that
    differs (or the one after the whole draft) follows."""
    kept = 0
    while kept < len(draft) and chosen[kept] == draft[kept]:
        kept += 1
    return chosen[: kept + 1]


def drafts_of(rows: list[Any], width: int) -> list[list[int]]:
    """Each slot's draft this step, at most `width` long (free slots, given as None, and requests that do
    not speculate: none). Each draft also leaves room for the token after it within its request's
    max_length: the pass that verifies it yields that token too."""
    drafts: list[list[int]] = []
    for row in rows:
        drafter = row.options.drafter if row is not None else None
        if drafter is None:
            drafts.append([])
            continue
        settings = row.options.settings
        left = settings.max_length - settings.prompt_length - len(row.tokens) - 1
        drafts.append(drafter.draft(row.prompt + row.tokens, min(left, width)))
    return drafts
