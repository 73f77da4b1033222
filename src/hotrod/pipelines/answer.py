"""Extractive question answering as transformers 4.x's `pipeline("question-answering")` answered it.

transformers 5 removed that pipeline; its algorithm is kept here step for step (checked against 4.57's).
The question is read with each window of the context that fits `max_seq_len` tokens, neighbouring windows
sharing `doc_stride` tokens; all the windows of a request are rows of one batch. In each window, start and
end logits outside the context are masked (the first token, [CLS], stays: some models answer "impossible"
there), softmaxed, and every span of at most `max_answer_len` tokens is scored p(start) x p(end). The best
spans of every window become character spans of the context (widened to whole words with
`align_to_words`); an answer found in several windows, compared without case, adds up its scores. With
`handle_impossible_answer`, the empty answer competes at the lowest [CLS] score of the windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotrod.errors import HotrodError, check_count
from hotrod.pipelines.base import Prepared, Row, check_text, require_tokenizer

MAX_SEQ_LEN = 384  # the pipeline's longest window, when the tokenizer and the model allow as much
MAX_STRIDE = 128
NULL_SCORE = 1_000_000.0  # the pipeline's start for the lowest [CLS] score: above any probability
_MASKED = -10000.0  # the logit given to tokens that cannot answer, as the pipeline did


@dataclass(frozen=True)
class Window:
    """One window of one example: which tokens cannot be in the answer, and the tokenizer's map of its
    tokens to words and characters."""

    example: int
    p_mask: np.ndarray  # [1, tokens]: 1 where no answer can be (question, special tokens; [CLS] excepted)
    encoding: Any  # tokenizers.Encoding


def prepare(model: Any, question: Any, context: Any = None, top_k: int = 1, doc_stride: int | None = None,
            max_answer_len: int = 15, max_seq_len: int | None = None, max_question_len: int = 64,
            handle_impossible_answer: bool = False, align_to_words: bool = True) -> Prepared:
    """`model.answer(...)`: the answer span as transformers 4.x's `pipeline("question-answering")` gave it,
    {"answer", "score", "start", "end"} (a list of the top_k when top_k > 1, unless only one was found);
    several questions (a list, with one context or a list of them, or a list of (question, context) pairs)
    give one per question. This makes the rows of every window of one (question, context), or of several
    (see `examples`), which run in one batch.

    As the pipeline: max_seq_len defaults to min(the tokenizer's longest, 384) tokens within the model's
    positions, and doc_stride to min(max_seq_len / 2, 128), lowered to fit beside a long question."""
    tokenizer = require_tokenizer(model, "answer")
    if not getattr(tokenizer, "is_fast", False):
        raise HotrodError("answer() needs a fast tokenizer: answers are located through its offsets")
    for name, value in (("top_k", top_k), ("max_answer_len", max_answer_len), ("max_question_len", max_question_len)):
        check_count(name, value)
    max_seq_len = _window_length(model, max_seq_len)
    if doc_stride is not None and check_count("doc_stride", doc_stride, 0) > max_seq_len:
        raise HotrodError(f"doc_stride ({doc_stride}) is larger than max_seq_len ({max_seq_len})")
    items, single = examples(question, context)
    rows: list[Row] = []
    windows: list[Window] = []
    for index, (asked, text) in enumerate(items):
        name = "the question" if single else f"question {index}"
        for row, window in _windows(model, index, name, asked, text, max_seq_len, doc_stride, max_question_len):
            rows.append(row)
            windows.append(window)
    options = {"top_k": top_k, "max_answer_len": max_answer_len, "impossible": bool(handle_impossible_answer),
               "align_to_words": bool(align_to_words)}
    return Prepared(rows, state=(single, [text for _, text in items], windows), options=options)


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> Any:
    """Each example's answer {"answer", "score", "start", "end"} (with top_k > 1 its best, a list, unless
    only one was found: the pipeline gives that one alone); one example's alone, several as a list."""
    single, contexts, windows = prepared.state
    found: list[list[tuple[Window, dict]]] = [[] for _ in contexts]
    for window, out in zip(windows, outputs):
        found[window.example].append((window, out))
    sequence = 1 if model.tokenizer.padding_side == "right" else 0
    results = [_best(context, found[i], prepared.options, sequence, "the context" if single else f"context {i}")
               for i, context in enumerate(contexts)]
    return results[0] if single else results


def examples(question: Any, context: Any) -> tuple[list[tuple[str, str]], bool]:
    """(question, context) pairs and whether one was given, as the 4.x pipeline read its arguments: a
    question and a context; several questions on one context; lists of questions and contexts, paired in
    order; or, without a context, a list of (question, context) pairs or {"question", "context"} dicts."""
    if isinstance(question, str):
        if not isinstance(context, str):
            raise HotrodError("a question needs a context (a string)" if context is None else
                              f"context must be a string, got {type(context).__name__}")
        return [(check_text(question, "the question"), check_text(context, "the context"))], True
    if not isinstance(question, Sequence):
        raise HotrodError("give a question and a context, or a list of (question, context) pairs")
    if not question:
        raise HotrodError("no questions to answer")
    if context is None:
        return [_pair(item, i) for i, item in enumerate(question)], False
    contexts = [context] * len(question) if isinstance(context, str) else context
    if not isinstance(contexts, Sequence) or len(contexts) != len(question):
        given = len(contexts) if isinstance(contexts, Sequence) else "no"
        raise HotrodError(f"{len(question)} questions and {given} contexts; give one context, or one for each question")
    return [(check_text(q, f"question {i}"), check_text(c, f"context {i}"))
            for i, (q, c) in enumerate(zip(question, contexts))], False


def _pair(item: Any, index: int) -> tuple[str, str]:
    if isinstance(item, dict):
        unknown = set(item) - {"question", "context"}
        if unknown:
            raise HotrodError(f"input {index} has unknown key(s) {', '.join(sorted(unknown))}; use question, context")
        item = (item.get("question"), item.get("context"))
    if not isinstance(item, list | tuple) or len(item) != 2:
        raise HotrodError(f"input {index} must be a (question, context) pair or a dict of them")
    return check_text(item[0], f"question {index}"), check_text(item[1], f"context {index}")


def _window_length(model: Any, max_seq_len: int | None) -> int:
    """The tokens of a window: the pipeline's min(tokenizer's longest, 384) by default, within the model's
    positions (the pipeline itself would run past them)."""
    positions = model.dims.max_positions
    if max_seq_len is None:
        longest = getattr(model.tokenizer, "model_max_length", None) or MAX_SEQ_LEN
        return min(longest, MAX_SEQ_LEN, positions or MAX_SEQ_LEN)
    check_count("max_seq_len", max_seq_len)
    if positions and max_seq_len > positions:
        raise HotrodError(f"max_seq_len {max_seq_len} is more than the model's {positions} positions")
    return max_seq_len


def _windows(model: Any, index: int, name: str, question: str, context: str, max_seq_len: int,
             doc_stride: int | None, max_question_len: int) -> list[tuple[Row, Window]]:
    """The question with each window of the context, cut as the pipeline cuts it (the question before the
    context where the tokenizer pads on the right, after it otherwise)."""
    tokenizer = model.tokenizer
    question_first = tokenizer.padding_side == "right"
    asked = len(tokenizer(question, add_special_tokens=False)["input_ids"])
    if asked > max_question_len:
        raise HotrodError(f"{name} has {asked} tokens, more than max_question_len ({max_question_len})")
    room = max_seq_len - asked - tokenizer.num_special_tokens_to_add(pair=True)
    if room < 1:
        raise HotrodError(f"{name} ({asked} tokens) leaves no room for its context in a window of {max_seq_len} "
                          "tokens; raise max_seq_len or shorten the question")
    stride = _stride(tokenizer, context, doc_stride, max_seq_len, room, name)
    try:
        encoded = tokenizer(text=question if question_first else context,
                            text_pair=context if question_first else question,
                            truncation="only_second" if question_first else "only_first", max_length=max_seq_len,
                            stride=stride, return_token_type_ids=True, return_overflowing_tokens=True,
                            return_offsets_mapping=True)
    except Exception as exc:  # noqa: BLE001 - tokenizers raise bare Exceptions
        raise HotrodError(f"{name} and its context cannot be cut into windows: {exc}") from None
    types = encoded.get("token_type_ids") if model.dims.type_vocab_size > 1 else None  # one type: all 0
    found = []
    for span, ids in enumerate(encoded["input_ids"]):
        # as the pipeline: with the context first, nothing is masked
        p_mask = np.array([[int(s != 1) if question_first else 0 for s in encoded.sequence_ids(span)]])
        if tokenizer.cls_token_id is not None:  # [CLS] can mean "no answer"
            p_mask[0, np.nonzero(np.array(ids) == tokenizer.cls_token_id)[0]] = 0
        found.append((Row(list(ids), list(types[span]) if types is not None else None),
                      Window(index, p_mask, encoded.encodings[span])))
    return found


def _stride(tokenizer: Any, context: str, doc_stride: int | None, max_seq_len: int, room: int, name: str) -> int:
    """The tokens neighbouring windows share: the pipeline's default, min(max_seq_len / 2, 128), lowered
    below the `room` a window has for the context beside a long question (where the pipeline's tokenizer
    fails); a stride given that does not fit is refused when the context needs more than one window."""
    if doc_stride is None:
        return min(max_seq_len // 2, MAX_STRIDE, room - 1)
    if doc_stride >= room and len(tokenizer(context, add_special_tokens=False)["input_ids"]) > room:
        raise HotrodError(f"doc_stride ({doc_stride}) must be less than the {room} context tokens a window of "
                          f"{max_seq_len} holds beside {name}")
    return doc_stride


def _best(context: str, found: list[tuple[Window, dict]], options: dict, sequence: int, name: str) -> Any:
    """The example's best answers over its windows, as the pipeline's postprocess picks them."""
    top_k, align = options["top_k"], options["align_to_words"]
    null_score = NULL_SCORE
    answers: list[dict] = []
    candidates = top_k * 2 + 10 if align else top_k  # some merge once widened to words
    for window, out in found:
        start = out["start_logits"].float().numpy()[None]
        end = out["end_logits"].float().numpy()[None]
        starts, ends, scores, null_score = select_spans(start, end, window.p_mask, null_score, candidates,
                                                        options["impossible"], options["max_answer_len"])
        for s, e, score in zip(starts, ends, scores):
            first, last = _characters(window.encoding, int(s), int(e), sequence, align)
            text = context[first:last]
            same = next((a for a in answers if a["answer"].lower() == text.lower()), None)
            if same:
                same["score"] += score.item()
            else:
                answers.append({"score": score.item(), "start": first, "end": last, "answer": text})
    if options["impossible"]:
        answers.append({"score": null_score, "start": 0, "end": 0, "answer": ""})
    answers = sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
    if len(answers) == 1:
        return answers[0]
    if not answers and top_k == 1:
        raise HotrodError(f"{name} has no token an answer could start at")
    return answers


def select_spans(start: np.ndarray, end: np.ndarray, p_mask: np.ndarray, null_score: float, top_k: int,
                 impossible: bool, max_answer_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(starts, ends, scores) of a window's best `top_k` spans ([1, tokens] logits), and the lowest [CLS]
    score so far: the pipeline's `select_starts_ends`."""
    allowed = np.abs(p_mask - 1) & np.ones_like(p_mask)
    masked = allowed == 0
    start = _softmax(np.where(masked, _MASKED, start))
    end = _softmax(np.where(masked, _MASKED, end))
    if impossible:
        null_score = min(null_score, (start[0, 0] * end[0, 0]).item())
    start[0, 0] = end[0, 0] = 0.0
    starts, ends, scores = decode_spans(start, end, top_k, max_answer_len, allowed)
    return starts, ends, scores, null_score


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum()


def decode_spans(start: np.ndarray, end: np.ndarray, top_k: int, max_answer_len: int,
                 allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `top_k` best spans of start x end probabilities, end not before start and at most
    `max_answer_len` tokens long, both ends where `allowed`: the pipeline's `decode_spans`, to its order of
    equal scores (numpy's argpartition) and its test of `allowed` (whose nonzero() row indices also admit
    position 0)."""
    outer = np.matmul(np.expand_dims(start, -1), np.expand_dims(end, 1))
    candidates = np.tril(np.triu(outer), max_answer_len - 1)
    flat = candidates.flatten()
    if top_k == 1:
        order = [np.argmax(flat)]
    elif len(flat) < top_k:
        order = np.argsort(-flat)
    else:
        best = np.argpartition(-flat, top_k)[0:top_k]
        order = best[np.argsort(-flat[best])]
    starts, ends = np.unravel_index(order, candidates.shape)[1:]
    kept = np.isin(starts, allowed.nonzero()) & np.isin(ends, allowed.nonzero())
    starts, ends = starts[kept], ends[kept]
    return starts, ends, candidates[0, starts, ends]


def _characters(encoding: Any, first: int, last: int, sequence: int, align_to_words: bool) -> tuple[int, int]:
    """The characters of tokens first..last in the context: of their whole words with `align_to_words`
    (the tokens' own where a token has no word in the context, as [CLS] has none)."""
    if align_to_words:
        try:
            return (encoding.word_to_chars(encoding.token_to_word(first), sequence_index=sequence)[0],
                    encoding.word_to_chars(encoding.token_to_word(last), sequence_index=sequence)[1])
        except TypeError:  # a token of no word (None), or of none in the context: the pipeline's fallback
            pass
    return encoding.offsets[first][0], encoding.offsets[last][1]
