"""Verification: an optimized model's answers against the source model's, on real inputs.

The reference is the source checkpoint run by hotrod's torch backend, which the test suite holds
token-identical to transformers; both sides then go through the same decoding loop and the same task
steps, so every difference measured here comes from the graphs (fusion, precision, quantization).

What is measured is what the model's task measures (`hotrod.verification`):
- language models: logits max-abs and cosine, greedy token agreement, exact match of whole generations,
  and task exact match where examples carry targets;
- feature-extraction encoders: last hidden state max-abs and cosine, mean-pooled embedding cosine;
- text-classification: label agreement and score differences; one-output heads (cross-encoders): rank
  agreement per query; token-classification: entity F1; question-answering: answer exact match and F1.
`score` is the one number `--precision auto` budgets against (`score_name` names it): task exact match
when a language model's examples have targets, else agreement with the source on the task's measure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.optimize.calibration import token_rows
from hotrod.verification import examples as task_examples
from hotrod.verification.answers import compare_answers
from hotrod.verification.classification import compare_labels, compare_ranking
from hotrod.verification.embeddings import compare_embeddings
from hotrod.verification.examples import Example
from hotrod.verification.generation import compare_generations
from hotrod.verification.tokens import compare_entities

__all__ = ["DEFAULT_EXAMPLES", "Example", "Remembered", "builtin_examples", "compare", "measure", "read_examples"]

DEFAULT_EXAMPLES = 100
_TASK_COMPARERS = {task_examples.LABELS: compare_labels, task_examples.RANKING: compare_ranking,
                   task_examples.ENTITIES: compare_entities, task_examples.ANSWERS: compare_answers}


def measure(model: Any) -> str:
    """What verification measures for `model` (`hotrod.verification.examples.measure_of`)."""
    return task_examples.measure_of(model.task, model.dims.num_labels, model.spec.generates)


def read_examples(path: str | Path, model: Any = None) -> list[Example]:
    """A task file's examples in `model`'s format (a language model's, `input[<TAB>target]`, without one)."""
    if model is None:
        return task_examples.read_examples(path)
    return task_examples.read_examples(path, measure(model), list(model.labels.values()))


def builtin_examples(model: Any = None) -> list[Example]:
    """The built-in examples for `model`'s measure (plain texts without one)."""
    return task_examples.builtin_examples(task_examples.GENERATION if model is None else measure(model))


@torch.inference_mode()
def compare(candidate: Any, reference: Any, examples: Sequence[Example], max_new_tokens: int | None = None,
            seed: int = 0) -> dict:
    """Run both HotrodModels on each example and return the figures for the manifest."""
    if not examples:
        raise HotrodError("verification needs at least one example")
    comparer = _TASK_COMPARERS.get(measure(candidate))
    if comparer is not None:
        return comparer(candidate, reference, examples)
    room = candidate.spec.room(max_new_tokens or 20)
    pairs = [(torch.tensor([row], dtype=torch.long), example)
             for row, example in zip(token_rows(candidate, [e.text for e in examples], room, seed), examples) if row]
    rows, examples = [ids for ids, _ in pairs], [example for _, example in pairs]  # targets stay with their rows
    if not rows:
        raise HotrodError("none of the verification examples has any token")
    if not candidate.spec.generates:
        figures = compare_embeddings(candidate, reference, rows)
    else:
        figures = compare_generations(candidate, reference, rows, examples, max_new_tokens)
    return {"examples": len(rows), **figures}


class Remembered:
    """A reference model whose answers are computed once: `--precision auto` compares every candidate with
    the same source outputs, and the source (eager PyTorch) is the slowest model in the comparison."""

    def __init__(self, model: Any):
        self.model = model
        self._answers: dict[tuple, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self._remember("call", self.model, args, kwargs)

    def generate(self, *args, **kwargs):
        return self._remember("generate", self.model.generate, args, kwargs)

    def run_rows(self, *args, **kwargs):
        return self._remember("run_rows", self.model.run_rows, args, kwargs)

    def _remember(self, what: str, fn, args, kwargs):
        key = (what, *(_key(a) for a in args), *sorted((k, _key(v)) for k, v in kwargs.items()))
        if key not in self._answers:
            self._answers[key] = fn(*args, **kwargs)
        return self._answers[key]


def _key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), tuple(value.flatten().tolist())
    if isinstance(value, list | tuple):
        return tuple(_key(v) for v in value)
    if hasattr(value, "input_ids"):  # a task row (`hotrod.pipelines.Row`)
        return tuple(value.input_ids), tuple(value.token_type_ids or ())
    return value
