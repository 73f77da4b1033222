"""question-answering: the span of a context that answers a question, as transformers 4.x's
`pipeline("question-answering")` found it (`hotrod.pipelines.answer`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hotrod.errors import HotrodError
from hotrod.pipelines import answer
from hotrod.tasks.constants import ANSWER
from hotrod.tasks.registry import Bench, Command, Door, Output, Route, TaskSpec, register
from hotrod.verification.measures import ANSWERS

# A context's characters per token of a window at most: bounds a context before it is tokenized.
_CHARACTERS_PER_TOKEN = 16
MAX_ANSWER_TOKENS = 30  # the bench's span search's longest answer, as transformers' QA pipeline's max_answer_len


class SpanClassifier(nn.Module):
    """`qa_outputs` on every token, split into start and end logits."""

    def __init__(self, config):
        super().__init__()
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, hidden, attention_mask):
        start, end = self.qa_outputs(hidden).unbind(dim=-1)
        return start, end


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--question", required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--context")
    source.add_argument("--context-file", metavar="FILE", help="read the context from FILE (UTF-8)")
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--max-answer-len", type=int, default=15, help="tokens")
    p.add_argument("--max-seq-len", type=int, default=None, help="tokens a window (default 384, or the model's)")
    p.add_argument("--doc-stride", type=int, default=None, help="tokens windows share (default 128)")
    p.add_argument("--impossible", action="store_true", help="allow the answer that the context has none")
    p.add_argument("--no-align-to-words", dest="align_to_words", action="store_false",
                   help="answer the tokens' own characters, not their whole words")


def _call(model: Any, args: argparse.Namespace) -> Any:
    context = args.context if args.context is not None else _read_text(args.context_file)
    return model.answer(args.question, context, top_k=args.top_k, max_answer_len=args.max_answer_len,
                        max_seq_len=args.max_seq_len, doc_stride=args.doc_stride,
                        handle_impossible_answer=args.impossible, align_to_words=args.align_to_words)


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise HotrodError(f"{path} is not UTF-8 text") from None


def _show(args: argparse.Namespace, result: Any):
    for a in result if isinstance(result, list) else [result]:
        yield f"{a['score']:.4f}\t{a['start']}-{a['end']}\t{a['answer']}"


def best_spans(start: torch.Tensor, end: torch.Tensor, mask: torch.Tensor,
               longest: int = MAX_ANSWER_TOKENS) -> torch.Tensor:
    """[rows, 2] start and end token of each row's best span: start <= end < start + `longest`, both on
    real tokens, the highest start + end logit (the search of transformers' QA pipeline, without its
    question masking: the bench's rows are not split into question and context)."""
    real = mask.bool()
    scores = start[:, :, None] + end[:, None, :]
    width = scores.shape[-1]
    allowed = torch.ones(width, width, dtype=torch.bool).triu().tril(longest - 1)
    allowed = allowed[None] & real[:, :, None] & real[:, None, :]
    best = scores.masked_fill(~allowed, float("-inf")).flatten(1).argmax(dim=1)
    return torch.stack([best // width, best % width], dim=1)


def span_f1(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Mean token-overlap F1 of two [rows, 2] span sets (SQuAD's F1, over token positions)."""
    scores = []
    for (a, b), (c, d) in zip(ours.tolist(), theirs.tolist()):
        overlap = max(0, min(b, d) - max(a, c) + 1)
        scores.append(0.0 if not overlap else 2 * overlap / ((b - a + 1) + (d - c + 1)))
    return sum(scores) / len(scores)


def _schemas() -> tuple[type, type]:
    from hotrod.serve.task_schemas import AnswerRequest, AnswerResponse

    return AnswerRequest, AnswerResponse


def _door(body: Any) -> Door:
    return Door("context", 1, [("context", body.context)], truncate=True,
                other=[("question", [("question", body.question)], False)])


def _check(body: Any, limits: Any) -> None:
    """A context too long for the windows a request may run is refused before it is tokenized."""
    windows = limits.max_batch_inputs
    if len(body.context) > windows * answer.MAX_SEQ_LEN * _CHARACTERS_PER_TOKEN:
        raise ValueError(f"context: {len(body.context)} characters is more than the {windows} windows this "
                         "server runs per request (--max-batch-inputs) can hold")


def _arguments_of(body: Any) -> tuple:
    return (body.question, body.context, body.top_k, body.doc_stride, body.max_answer_len, body.max_seq_len,
            body.max_question_len, body.handle_impossible_answer, body.align_to_words)


def _respond(body: Any, found: Any, reply: Any) -> Any:
    from hotrod.serve.task_schemas import AnswerResponse

    return AnswerResponse(model=reply.model, answers=found if isinstance(found, list) else [found],
                          windows=reply.rows, usage=reply.usage)


SPEC = register(TaskSpec(
    ANSWER, kinds=("encoder",), heads=("ForQuestionAnswering",),
    outputs=(Output("start_logits", ("batch", "sequence")), Output("end_logits", ("batch", "sequence"))),
    head=SpanClassifier, method="answer", pipeline=answer, measure=ANSWERS,
    command=Command("answer", "the answer to a question, taken from a context (extractive QA)", _arguments, _call,
                    _show, truncate=False),
    route=Route("/v1/answer", "answer", _schemas, _door, _arguments_of, _respond, check=_check,
                fields=("question", "doc_stride", "max_seq_len"), bounded_rows=False, many="windows"),
    bench=Bench("AutoModelForQuestionAnswering",
                lambda out, mask: best_spans(out.start_logits.float(), out.end_logits.float(), mask),
                lambda ours, theirs, mask: span_f1(ours, theirs)),
    summary="the span of a context that answers a question",
))
