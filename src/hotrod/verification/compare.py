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
Each task's spec names its measure (`hotrod.verification.measures`). `score` is the one number
`--precision auto` budgets against (`score_name` names it): task exact match
when a language model's examples have targets, else agreement with the source on the task's measure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hotrod import tasks
from hotrod.errors import HotrodError
from hotrod.verification import examples as task_examples
from hotrod.verification.examples import Example
from hotrod.verification.inputs import builtin_texts
from hotrod.verification.measures import GENERATION, Measure

__all__ = ["DEFAULT_EXAMPLES", "Example", "Remembered", "builtin_examples", "compare", "examples_for", "measure",
           "measure_of", "read_examples"]

DEFAULT_EXAMPLES = 100


def measure(model: Any) -> Measure:
    """What verification measures for `model`: its task's measure (`hotrod.verification.measures`)."""
    return model.task_spec.measure


def measure_of(family: Any, config: Any) -> tuple[Measure, list[str]]:
    """What verification measures for a checkpoint of `family` before it is built, and its head's labels."""
    dims = family.dims(config)
    labels = list(tasks.labels(config, dims.task).values())
    return tasks.of_model(dims.task, dims.num_labels, labels).measure, labels


def read_examples(path: str | Path, model: Any = None) -> list[Example]:
    """A task file's examples in `model`'s format (a language model's, `input[<TAB>target]`, without one)."""
    if model is None:
        return task_examples.read_examples(path, GENERATION.parse)
    return task_examples.read_examples(path, measure(model).parse, list(model.labels.values()))


def builtin_examples(model: Any = None) -> list[Example]:
    """The built-in examples for `model`'s measure (plain texts without one)."""
    return (GENERATION if model is None else measure(model)).from_texts(builtin_texts())


def examples_for(given: Any, found: Measure, labels: Sequence[str]) -> list[Example]:
    """The examples for `found`: a task file, given examples or texts, or the built-in ones (None)."""
    if given is None:
        return found.from_texts(builtin_texts())
    if isinstance(given, (str, Path)):
        return task_examples.read_examples(given, found.parse, labels)
    items = list(given)
    if items and all(isinstance(e, str) for e in items):
        items = found.from_texts(items)
    chosen = [e if isinstance(e, Example) else Example(str(e)) for e in items]
    if not chosen:
        raise HotrodError("verification examples are empty")
    return chosen


@torch.inference_mode()
def compare(candidate: Any, reference: Any, examples: Sequence[Example], max_new_tokens: int | None = None,
            seed: int = 0) -> dict:
    """Run both HotrodModels on each example and return the figures for the manifest."""
    if not examples:
        raise HotrodError("verification needs at least one example")
    return measure(candidate).compare(candidate, reference, examples, max_new_tokens, seed)


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
