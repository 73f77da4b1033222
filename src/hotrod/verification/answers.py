"""question-answering heads: the candidate's answers against the source's, exact match and SQuAD F1.

Each question is read with every window of its context (`rows.answer_windows`); the answer is the span
of at most `MAX_ANSWER_TOKENS` context tokens with the highest start x end probability across windows,
as transformers' pipeline picks it. Where examples carry an answer, both models are also scored on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.verification import metrics
from hotrod.verification.examples import Example
from hotrod.verification.rows import Window, answer_windows

MAX_ANSWER_TOKENS = 15  # transformers' max_answer_len


def compare_answers(candidate: Any, reference: Any, examples: Sequence[Example]) -> dict:
    windows = [answer_windows(candidate, e.text, e.pair) for e in examples]
    ours, theirs = answers(candidate, examples, windows), answers(reference, examples, windows)
    exact = _mean([metrics.answer_exact(a, b) for a, b in zip(ours, theirs)])
    f1 = _mean([metrics.answer_f1(a, b) for a, b in zip(ours, theirs)])
    figures = {"examples": len(examples), "windows": sum(map(len, windows)), "answer_exact_match": exact,
               "answer_f1": f1}
    given = [(i, e.target) for i, e in enumerate(examples) if e.target is not None]
    if given:
        figures["target_f1"] = _mean([metrics.answer_f1(ours[i], t) for i, t in given])
        figures["source_target_f1"] = _mean([metrics.answer_f1(theirs[i], t) for i, t in given])
        figures["target_exact_match"] = _mean([metrics.answer_exact(ours[i], t) for i, t in given])
    return {**figures, "score": f1, "score_name": "answer F1"}


def answers(model: Any, examples: Sequence[Example], windows: list[list[Window]]) -> list[str]:
    """Each example's best answer: context text, or token positions ("3 4 5") without a tokenizer."""
    flat = [w for ws in windows for w in ws]
    outputs = iter(model.run_rows([w.row for w in flat]))
    result = []
    for example, ws in zip(examples, windows):
        spans = [(*best_span(next(outputs), w), w) for w in ws]
        score, start, end, window = max(spans, key=lambda s: s[0])
        result.append(_text(example.pair, window, start, end))
    return result


def best_span(out: dict[str, torch.Tensor], window: Window) -> tuple[float, int, int]:
    """(probability, start, end) of the window's best context span, end inclusive."""
    context = torch.tensor(window.context)
    start = _probabilities(out["start_logits"], context)
    end = _probabilities(out["end_logits"], context)
    joint = torch.triu(start[:, None] * end[None, :]).tril(MAX_ANSWER_TOKENS - 1)
    flat = int(joint.argmax())
    first, last = divmod(flat, joint.shape[1])
    return float(joint[first, last]), first, last


def _probabilities(logits: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.float().masked_fill(~context, float("-inf")), dim=-1)


def _text(context: str, window: Window, start: int, end: int) -> str:
    if window.offsets is None:
        return " ".join(str(p) for p in range(start, end + 1))
    return context[window.offsets[start][0]:window.offsets[end][1]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 1.0
