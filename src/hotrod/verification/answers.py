"""question-answering heads: the candidate's answers against the source's, exact match and SQuAD F1.

With a tokenizer, both models answer as `HotrodModel.answer` does (`hotrod.pipelines.answer`, transformers'
QA pipeline): each model reads the same windows of each context, and its answer is the text the pipeline
picks from them. A model without a tokenizer reads one row of seeded ids per example (`rows.id_window`);
its answer is the token positions of the span the pipeline's span search picks there. Where examples carry
an answer, both models are also scored on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hotrod.pipelines import answer
from hotrod.verification import metrics
from hotrod.verification.examples import Example
from hotrod.verification.rows import Window, id_window

MAX_ANSWER_TOKENS = 15  # the pipeline's max_answer_len


def compare_answers(candidate: Any, reference: Any, examples: Sequence[Example]) -> dict:
    ours, theirs, windows = answers(candidate, reference, examples)
    exact = _mean([metrics.answer_exact(a, b) for a, b in zip(ours, theirs)])
    f1 = _mean([metrics.answer_f1(a, b) for a, b in zip(ours, theirs)])
    figures = {"examples": len(examples), "windows": windows, "answer_exact_match": exact, "answer_f1": f1}
    given = [(i, e.target) for i, e in enumerate(examples) if e.target is not None]
    if given:
        figures["target_f1"] = _mean([metrics.answer_f1(ours[i], t) for i, t in given])
        figures["source_target_f1"] = _mean([metrics.answer_f1(theirs[i], t) for i, t in given])
        figures["target_exact_match"] = _mean([metrics.answer_exact(ours[i], t) for i, t in given])
    return {**figures, "score": f1, "score_name": "answer F1"}


def answers(candidate: Any, reference: Any, examples: Sequence[Example]) -> tuple[list[str], list[str], int]:
    """Each example's answer from each model (context text, or token positions "3 4 5" without a
    tokenizer), and how many windows each model read."""
    if not examples:
        return [], [], 0
    if candidate.tokenizer is None:
        windows = [id_window(candidate, e.text, e.pair) for e in examples]
        rows = [w.row for w in windows]
        return _positions(candidate.run_rows(rows), windows), _positions(reference.run_rows(rows), windows), len(rows)
    prepared = answer.prepare(candidate, [e.text for e in examples], [e.pair for e in examples])

    def texts(model: Any) -> list[str]:
        return [found["answer"] for found in answer.finish(candidate, prepared, model.run_rows(prepared.rows))]

    return texts(candidate), texts(reference), len(prepared.rows)


def _positions(outputs: list[dict[str, torch.Tensor]], windows: list[Window]) -> list[str]:
    """The best span of each window, as its token positions."""
    found = []
    for out, window in zip(outputs, windows):
        p_mask = np.array([[0 if context else 1 for context in window.context]])
        starts, ends, _, _ = answer.select_spans(out["start_logits"].float().numpy()[None],
                                                 out["end_logits"].float().numpy()[None], p_mask,
                                                 answer.NULL_SCORE, 1, False, MAX_ANSWER_TOKENS)
        found.append(" ".join(str(p) for p in range(int(starts[0]), int(ends[0]) + 1)) if len(starts) else "")
    return found


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 1.0
