"""Examples as the rows an encoder head sees: single texts, text pairs, question + context windows.

Verification and int8-static calibration share these, so the ranges a static build is calibrated on come
from the inputs its task feeds it (a cross-encoder sees query/document pairs with their token types, a
reader sees a question before a window of context). A model without a tokenizer gets seeded random ids
of the texts' word counts (`hotrod.optimize.calibration.token_rows`), pairs joined with their types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hotrod.errors import HotrodError
from hotrod.pipelines import answer
from hotrod.pipelines.base import Row, encode
from hotrod.verification.inputs import token_rows


@dataclass(frozen=True)
class Window:
    """A question + context row of seeded ids (a model without a tokenizer): which positions are context."""

    row: Row
    context: tuple[bool, ...]


def example_rows(model, examples: Sequence) -> list[Row]:
    """One row per example: its text, or its text and pair, cut to the model's positions."""
    pairs = [e.pair for e in examples]
    if any(p is None for p in pairs) and any(p is not None for p in pairs):
        raise HotrodError("the examples mix single texts and text pairs; verify one kind at a time")
    texts = [e.text for e in examples]
    if model.tokenizer is not None:
        return encode(model, texts, None if pairs[0] is None else pairs, truncate=True)
    if pairs[0] is None:
        return [Row(ids) for ids in token_rows(model, texts)]
    return [_joined(model, a, b) for a, b in zip(token_rows(model, texts), token_rows(model, pairs, seed=1))]


def answer_rows(model, examples: Sequence) -> list[Row]:
    """The rows question + context examples run as: the windows `HotrodModel.answer` reads
    (`hotrod.pipelines.answer`, transformers' QA pipeline), or one row of seeded ids each without a tokenizer."""
    if not examples:
        return []
    if model.tokenizer is None:
        return [id_window(model, e.text, e.pair).row for e in examples]
    return answer.prepare(model, [e.text for e in examples], [e.pair for e in examples]).rows


def id_window(model, question: str, context: str) -> Window:
    """The question's and the context's seeded ids as one row, cut to the model's positions."""
    row = _joined(model, *token_rows(model, [question, context]))
    first = len(token_rows(model, [question])[0])
    return Window(row, tuple(i >= first for i in range(len(row))))


def _joined(model, first: list[int], second: list[int]) -> Row:
    """Two random-id rows as one pair, cut to the model's positions (the longer part first)."""
    limit = min(model.dims.max_positions or 512, 512)
    while len(first) + len(second) > limit:
        if len(first) > len(second):
            first = first[:-1]
        else:
            second = second[:-1]
    types = [0] * len(first) + [1] * len(second) if model.dims.type_vocab_size > 1 else None
    return Row(first + second, types)


def task_rows(model, texts: Sequence[str]) -> list[Row]:
    """The rows of plain `texts` as the model's task sees them (its measure's examples of them): calibration's
    inputs for encoder heads (pairs for cross-encoders, question + context windows for readers)."""
    measure = model.task_spec.measure
    return [row for row in measure.rows(model, measure.from_texts(texts)) if len(row)]
