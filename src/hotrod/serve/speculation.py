"""Speculative decoding in the running batch: each request's prompt-lookup drafts and how they fared.

A request that asks for it (`"speculate": {"prompt_lookup": N}`, or the server's `--speculate`) drafts up to
N tokens a step from its own text, as `generate(prompt_lookup_num_tokens=N)` does
(`hotrod.generation.lookup`): the tokens that followed the latest earlier occurrence of its last 3 or 2
tokens, or of its last token in its prompt. The runner verifies the drafts of every row in one pass of the batch and keeps each draft up to
the first token decoding would not have chosen (`GenerationRunner.step`). A draft rejected outright
pauses the request's drafting for a while, doubling while drafts keep failing, so that text which never
repeats decodes at plain decoding's pace.

The state is the request's own (`hotrod.serve.picks.RowOptions.drafter`, the `Drafter` that `generate()` drafts with too),
never the scheduler's.
"""

from __future__ import annotations

from typing import Any


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
