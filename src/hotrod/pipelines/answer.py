"""Extractive question answering as transformers 4.x's `pipeline("question-answering")` answered it.

transformers 5 removed that pipeline; this keeps its answers. A context too long for one window is split
into overlapping windows (`doc_stride` tokens shared), each holding the question and a part of the
context. In each window the tokens outside the context get no probability (except [CLS], the "no answer"
position), start and end logits go through a softmax, and the best spans are those of highest
p(start) * p(end) with start <= end < start + max_answer_len. The best spans over all windows win, with
their character offsets into the context, widened to whole words. All the windows of a question are rows
of one batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotrod.errors import HotrodError, check_count
from hotrod.pipelines.base import Prepared, Row, check_text, require_task, require_tokenizer
from hotrod.tasks import ANSWER

_MASKED = -10000.0  # the logit given to tokens that cannot answer, as the pipeline did


@dataclass
class _Window:
    encoding: Any  # the fast tokenizer's Encoding of the window: words and offsets
    context_tokens: np.ndarray  # bool [tokens]: may start or end an answer


@dataclass
class _Question:
    context: str
    windows: list[_Window]
    context_side: int  # the sequence index of the context in each window (1 when the question comes first)


def prepare(model: Any, question: str | Sequence, context: str | None = None, top_k: int = 1,
            doc_stride: int | None = None, max_answer_len: int = 15, max_seq_len: int | None = None,
            max_question_len: int = 64, handle_impossible_answer: bool = False) -> Prepared:
    """Rows of every window of one (question, context), or of a list of (question, context) pairs.

    As the pipeline: max_seq_len defaults to 384 tokens (fewer if the model has fewer positions), and
    doc_stride to 128 (at most half a window)."""
    require_task(model, ANSWER, "answer")
    tokenizer = require_tokenizer(model, "answer")
    if max_seq_len is None:
        max_seq_len = min(384, model.dims.max_positions or 384)
    if doc_stride is None:
        doc_stride = min(max_seq_len // 2, 128)
    if not getattr(tokenizer, "is_fast", False):
        raise HotrodError("answer() needs a fast tokenizer: answers are located through its offsets")
    for name, value in (("top_k", top_k), ("max_answer_len", max_answer_len), ("max_seq_len", max_seq_len),
                        ("max_question_len", max_question_len)):
        check_count(name, value)
    if isinstance(doc_stride, bool) or not isinstance(doc_stride, int) or doc_stride < 0:
        raise HotrodError(f"doc_stride must be a whole number >= 0, got {doc_stride!r}")
    if model.dims.max_positions and max_seq_len > model.dims.max_positions:
        raise HotrodError(f"max_seq_len {max_seq_len} is more than the model's {model.dims.max_positions} positions")
    if doc_stride >= max_seq_len:
        raise HotrodError(f"doc_stride ({doc_stride}) must be less than max_seq_len ({max_seq_len})")
    single = context is not None
    pairs = [(question, context)] if single else _pairs(question)
    rows: list[Row] = []
    questions, owners = [], []
    for i, (q, c) in enumerate(pairs):
        what = "" if single else f" {i}"
        entry, window_rows = _windows(model, check_text(q, f"question{what}"), check_text(c, f"context{what}"),
                                      doc_stride, max_seq_len, max_question_len, what)
        questions.append(entry)
        owners += [i] * len(window_rows)
        rows += window_rows
    options = {"top_k": top_k, "max_answer_len": max_answer_len, "impossible": bool(handle_impossible_answer)}
    return Prepared(rows, state=(single, questions, owners), options=options)


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> Any:
    """{"answer", "score", "start", "end"} (a list when top_k > 1) per question; a list of them for a list."""
    single, questions, owners = prepared.state
    answers = []
    for index, question in enumerate(questions):
        mine = [out for out, owner in zip(outputs, owners) if owner == index]
        answers.append(_best(question, mine, prepared.options))
    return answers[0] if single else answers


def _pairs(items: Any) -> list[tuple[Any, Any]]:
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise HotrodError("give a question and a context, or a list of (question, context) pairs")
    if not items:
        raise HotrodError("no questions to answer")
    pairs = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            item = (item.get("question"), item.get("context"))
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise HotrodError(f"item {i} must be a (question, context) pair")
        pairs.append((item[0], item[1]))
    return pairs


def _windows(model: Any, question: str, context: str, stride: int, max_seq_len: int, max_question_len: int,
             what: str) -> tuple[_Question, list[Row]]:
    tokenizer = model.tokenizer
    question_tokens = len(tokenizer(question, add_special_tokens=False)["input_ids"])
    if question_tokens > max_question_len:
        raise HotrodError(f"the question{what} has {question_tokens} tokens, more than max_question_len "
                          f"({max_question_len})")
    first = tokenizer.padding_side == "right"  # the question first, the context second (as the pipeline)
    texts = (question, context) if first else (context, question)
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    if question_tokens + specials + 1 > max_seq_len:
        raise HotrodError(f"the question{what} ({question_tokens} tokens) leaves no room for the context in a "
                          f"window of max_seq_len {max_seq_len}")
    encoded = tokenizer(*texts, truncation="only_second" if first else "only_first", max_length=max_seq_len,
                        stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                        return_token_type_ids=True)
    side = 1 if first else 0
    windows, rows = [], []
    for span in range(len(encoded["input_ids"])):
        ids = list(encoded["input_ids"][span])
        context_tokens = np.array([s == side for s in encoded.sequence_ids(span)])
        if tokenizer.cls_token_id is not None:  # [CLS] stays: the "no answer" position
            context_tokens |= np.array(ids) == tokenizer.cls_token_id
        types = encoded.get("token_type_ids") if model.dims.type_vocab_size > 1 else None  # one type: all 0
        types = types[span] if types is not None else None
        rows.append(Row(ids, list(types) if types is not None else None))
        windows.append(_Window(encoded.encodings[span], context_tokens))
    if not any(w.context_tokens.any() for w in windows):
        raise HotrodError(f"the context{what} has no tokens an answer could be taken from")
    return _Question(context, windows, side), rows


def _best(question: _Question, outputs: list[dict[str, torch.Tensor]], options: dict) -> Any:
    top_k, longest = options["top_k"], options["max_answer_len"]
    answers, null_score = [], 1_000_000.0
    for window, out in zip(question.windows, outputs):
        start = _softmax(np.where(window.context_tokens, out["start_logits"].float().numpy(), _MASKED))
        end = _softmax(np.where(window.context_tokens, out["end_logits"].float().numpy(), _MASKED))
        null_score = min(null_score, float(start[0] * end[0]))
        start[0] = end[0] = 0.0
        for s, e, score in _spans(start, end, top_k, longest, window.context_tokens):
            first, last = _characters(window.encoding, s, e, question.context_side)
            answers.append({"score": score, "start": first, "end": last, "answer": question.context[first:last]})
    if options["impossible"]:
        answers.append({"score": null_score, "start": 0, "end": 0, "answer": ""})
    if not answers:
        raise HotrodError("no span of the context can answer (every candidate is outside it or too long)")
    answers = sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
    return answers[0] if len(answers) == 1 else answers


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def _spans(start: np.ndarray, end: np.ndarray, top_k: int, longest: int,
           allowed: np.ndarray) -> list[tuple[int, int, float]]:
    """The top_k (start, end, p(start) * p(end)) with start <= end < start + longest, both in the context."""
    candidates = np.tril(np.triu(np.outer(start, end)), longest - 1)
    flat = candidates.flatten()
    if top_k == 1:
        order = np.array([np.argmax(flat)])
    elif len(flat) < top_k:
        order = np.argsort(-flat)
    else:
        best = np.argpartition(-flat, top_k)[:top_k]
        order = best[np.argsort(-flat[best])]
    starts, ends = np.unravel_index(order, candidates.shape)
    return [(int(s), int(e), float(candidates[s, e])) for s, e in zip(starts, ends) if allowed[s] and allowed[e]]


def _characters(encoding: Any, start: int, end: int, side: int) -> tuple[int, int]:
    """Character offsets of tokens start..end in the context, widened to the words they fall in."""
    first_word, last_word = encoding.token_to_word(start), encoding.token_to_word(end)
    if first_word is None or last_word is None:
        return encoding.offsets[start][0], encoding.offsets[end][1]
    return encoding.word_to_chars(first_word, side)[0], encoding.word_to_chars(last_word, side)[1]
