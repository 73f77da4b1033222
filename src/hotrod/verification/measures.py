"""Verification measures: how a task's answers are checked against the source model's, one object each.

A task's spec names its measure (`hotrod.tasks`); verification, `--precision auto` and int8-static
calibration ask the measure, never the task's name:

- `parse` reads one line of a task file (`--verify-texts`) into an Example, or raises ValueError naming
  what is wrong; `file_format` says what a line holds;
- `from_texts` builds examples from plain texts (the built-in sentences, or a list of texts);
- `compare` runs both models on the examples and returns the figures, with `score` and `score_name`;
- `rows`, for encoder heads, gives the rows the head sees of the examples: verification, calibration and
  auto's timing run the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.pipelines.base import Row
from hotrod.verification import examples as ex
from hotrod.verification.answers import compare_answers
from hotrod.verification.classification import compare_labels, compare_ranking
from hotrod.verification.embeddings import compare_embeddings
from hotrod.verification.examples import Example
from hotrod.verification.generation import compare_generations
from hotrod.verification.inputs import token_rows
from hotrod.verification.rows import answer_rows, example_rows
from hotrod.verification.sparse import compare_sparse
from hotrod.verification.tokens import compare_entities

Compare = Callable[[Any, Any, Sequence[Example], int | None, int], dict]


@dataclass(frozen=True)
class Measure:
    name: str
    file_format: str
    parse: ex.Parser
    from_texts: Callable[[Sequence[str]], list[Example]]
    compare: Compare  # (candidate, reference, examples, max_new_tokens, seed) -> figures
    rows: Callable[[Any, Sequence[Example]], list[Row]] | None = None  # an encoder head's rows of the examples
    shown: tuple[str, ...] = ()  # the figures shown beside the score (`hotrod info`, `hotrod optimize`)


def on_rows(compare: Callable[[Any, Any, Sequence[Example]], dict]) -> Compare:
    """A comparer of a head's answers on the examples' rows (generation settings do not apply)."""
    def run(candidate: Any, reference: Any, examples: Sequence[Example], max_new_tokens: int | None = None,
            seed: int = 0) -> dict:
        return compare(candidate, reference, examples)
    return run


def _token_rows(candidate: Any, examples: Sequence[Example], room: int, seed: int):
    """Each example's token ids as a [1, L] tensor, with its example (examples without tokens dropped)."""
    pairs = [(torch.tensor([row], dtype=torch.long), example)
             for row, example in zip(token_rows(candidate, [e.text for e in examples], room, seed), examples) if row]
    if not pairs:
        raise HotrodError("none of the verification examples has any token")
    return [ids for ids, _ in pairs], [example for _, example in pairs]  # targets stay with their rows


def _generations(candidate: Any, reference: Any, examples: Sequence[Example], max_new_tokens: int | None = None,
                 seed: int = 0) -> dict:
    rows, kept = _token_rows(candidate, examples, candidate.spec.room(max_new_tokens or 20), seed)
    return {"examples": len(rows), **compare_generations(candidate, reference, rows, kept, max_new_tokens)}


def _embeddings(candidate: Any, reference: Any, examples: Sequence[Example], max_new_tokens: int | None = None,
                seed: int = 0) -> dict:
    rows, _ = _token_rows(candidate, examples, 0, seed)
    return {"examples": len(rows), **compare_embeddings(candidate, reference, rows)}


GENERATION = Measure("generation", "input[<TAB>target]", ex.plain, ex.singles, _generations,
                     shown=("logits_max_abs", "logits_cosine", "token_agreement"))
EMBEDDINGS = Measure("embeddings", "input", ex.plain, ex.singles, _embeddings, rows=example_rows,
                     shown=("embedding_cosine", "hidden_max_abs"))
LABELS = Measure("labels", "text<TAB>label or text<TAB>text_pair<TAB>label", ex.labelled, ex.labelled_texts,
                 on_rows(compare_labels), rows=example_rows,
                 shown=("label_agreement", "score_mean_abs", "target_accuracy"))
RANKING = Measure("ranking", "query<TAB>document<TAB>score", ex.ranked, ex.ranking_texts, on_rows(compare_ranking),
                  rows=example_rows,
                  shown=("rank_agreement", "top1_agreement", "score_mean_abs", "target_rank_agreement"))
ENTITIES = Measure("entities", "plain texts", ex.tagged, ex.singles, on_rows(compare_entities), rows=example_rows,
                   shown=("entity_f1", "target_f1"))
ANSWERS = Measure("answers", "question<TAB>context<TAB>answer", ex.answered, ex.answer_texts,
                  on_rows(compare_answers), rows=answer_rows, shown=("answer_exact_match", "answer_f1", "target_f1"))

# Zero-shot classification's NLI heads see (premise, hypothesis) pairs: its examples are each text with the
# hypothesis the pipeline's default template makes of one of a few labels, in turn.
_ZERO_SHOT_LABELS = ("news", "a question", "about people", "about nature", "positive", "negative")


def _premise_hypothesis(fields: list[str], labels: Sequence[str]) -> Example:
    if len(fields) not in (2, 3):
        raise ValueError(f"expected premise<TAB>hypothesis[<TAB>label], got {len(fields)} field(s)")
    if len(fields) == 3 and fields[2].strip():
        return ex.labelled(fields, labels)  # the label one of the model's (entailment, ...)
    if not (fields[0].strip() and fields[1].strip()):
        raise ValueError("the premise or the hypothesis is empty")
    return Example(fields[0].strip(), pair=fields[1].strip())


def _premise_hypothesis_texts(texts: Sequence[str]) -> list[Example]:
    texts = ex.cleaned(texts)
    return ex.tab_pairs(texts) or [Example(t, pair=f"This example is {_ZERO_SHOT_LABELS[i % len(_ZERO_SHOT_LABELS)]}.")
                                   for i, t in enumerate(texts)]


ZERO_SHOT = Measure("zero-shot", "premise<TAB>hypothesis[<TAB>label]", _premise_hypothesis, _premise_hypothesis_texts,
                    on_rows(compare_labels), rows=example_rows,
                    shown=("label_agreement", "score_mean_abs", "target_accuracy"))

# Sparse (SPLADE) embeddings: the cosine of both models' vectors, and the share of the heaviest terms kept.
SPARSE = Measure("sparse", "input", ex.plain, ex.singles, on_rows(compare_sparse), rows=example_rows,
                 shown=("sparse_cosine", "top_overlap", "sparse_max_abs"))
