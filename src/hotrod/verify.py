"""Verification: an optimized model's answers against the source model's, on real inputs.

The reference is the source checkpoint run by hotrod's torch backend, which the test suite holds
token-identical to transformers; both sides then go through the same decoding loop, so every difference
measured here comes from the graphs (fusion, precision, quantization) and nothing else.

Figures, per kind:
- language models: logits max-abs difference and cosine, teacher-forced on the reference's own
  generation; greedy token agreement; exact match of whole generations; and, when examples carry
  targets, task exact match of both sides;
- encoders: last hidden state max-abs and cosine, and mean-pooled sentence embedding cosine.
`score` is the one number `--precision auto` budgets against: task exact match when targets exist,
else generation exact match with the source (language models) or mean embedding cosine (encoders).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.optimize.calibration import builtin_texts, read_texts, token_rows

DEFAULT_EXAMPLES = 100


@dataclass(frozen=True)
class Example:
    """One input text, and optionally the output a task expects (`input<TAB>target` in a file)."""

    text: str
    target: str | None = None


def read_examples(path: str | Path) -> list[Example]:
    """One example per non-empty line; a tab separates an optional expected output."""
    examples = []
    for line in read_texts(path, what="examples file"):
        text, _, target = line.partition("\t")
        if text.strip():
            examples.append(Example(text.strip(), target.strip() if target else None))
    if not examples:
        raise HotrodError(f"{path} has no examples")
    return examples


def builtin_examples() -> list[Example]:
    return [Example(text) for text in builtin_texts()]


@torch.inference_mode()
def compare(candidate: Any, reference: Any, examples: Sequence[Example], max_new_tokens: int | None = None,
            seed: int = 0) -> dict:
    """Run both HotrodModels on each example (batch 1) and return the figures for the manifest."""
    if not examples:
        raise HotrodError("verification needs at least one example")
    room = candidate.spec.room(max_new_tokens or 20)
    pairs = [(torch.tensor([row], dtype=torch.long), example)
             for row, example in zip(token_rows(candidate, [e.text for e in examples], room, seed), examples) if row]
    rows, examples = [ids for ids, _ in pairs], [example for _, example in pairs]  # targets stay with their rows
    if not rows:
        raise HotrodError("none of the verification examples has any token")
    if not candidate.spec.generates:
        figures = _compare_encoder(candidate, reference, rows)
    else:
        figures = _compare_lm(candidate, reference, rows, examples, max_new_tokens)
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

    def _remember(self, what: str, fn, args, kwargs):
        key = (what, *(_key(a) for a in args), *sorted((k, _key(v)) for k, v in kwargs.items()))
        if key not in self._answers:
            self._answers[key] = fn(*args, **kwargs)
        return self._answers[key]


def _key(value: Any) -> Any:
    return (tuple(value.shape), tuple(value.flatten().tolist())) if isinstance(value, torch.Tensor) else value


def _compare_encoder(candidate: Any, reference: Any, rows: list[torch.Tensor]) -> dict:
    max_abs, cosines, embeddings = 0.0, [], []
    name = candidate.spec.contracts(candidate.dims)["encoder"].output_names[0]
    for ids in rows:
        ours = candidate(ids)[name].float()[0]
        theirs = reference(ids)[name].float()[0]
        if ours.dim() == 1:  # one vector per row: a sequence head's logits
            ours, theirs = ours[None], theirs[None]
        max_abs = max(max_abs, float((ours - theirs).abs().max()))
        cosines.append(float(torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).mean()))
        embeddings.append(float(torch.nn.functional.cosine_similarity(ours.mean(0), theirs.mean(0), dim=0)))
    return {
        "hidden_max_abs": max_abs,
        "hidden_cosine": _mean(cosines),
        "embedding_cosine": _mean(embeddings),
        "embedding_cosine_min": min(embeddings),
        "score": _mean(embeddings),
        "score_name": "embedding cosine",
    }


def _compare_lm(candidate: Any, reference: Any, rows: list[torch.Tensor], examples: Sequence[Example],
                max_new_tokens: int | None) -> dict:
    kwargs = {"do_sample": False, "num_beams": 1}
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    max_abs, cosines, agree, total, exact = 0.0, [], 0, 0, 0
    task = {"ours": 0, "source": 0, "n": 0}
    for ids, example in zip(rows, examples):
        mask = torch.ones_like(ids)
        theirs = reference.generate(ids, attention_mask=mask, **kwargs)
        ours = candidate.generate(ids, attention_mask=mask, **kwargs)
        exact += int(torch.equal(ours, theirs))
        agree, total = agree + _agreement(ours[0], theirs[0]), total + theirs.shape[1]
        difference, cosine = _logits(candidate, reference, ids, theirs)
        max_abs = max(max_abs, difference)
        cosines.append(cosine)
        if example.target is not None and candidate.tokenizer is not None:
            prompt = ids.shape[1] if candidate.spec.continues_prompt else 0  # a start token decodes to ""
            task["ours"] += int(_text(candidate, ours[0, prompt:]) == example.target)
            task["source"] += int(_text(candidate, theirs[0, prompt:]) == example.target)
            task["n"] += 1
    figures = {
        "logits_max_abs": max_abs,
        "logits_cosine": _mean(cosines),
        "logits_cosine_min": min(cosines),
        "token_agreement": agree / max(total, 1),
        "exact_match": exact / len(rows),
        "score": exact / len(rows),
        "score_name": "exact match with the source's generations",
    }
    if task["n"]:
        figures.update({"task_exact_match": task["ours"] / task["n"], "source_task_exact_match":
                        task["source"] / task["n"], "score": task["ours"] / task["n"], "score_name": "task exact match"})
    return figures


def _agreement(ours: torch.Tensor, theirs: torch.Tensor) -> int:
    """Positions of the reference's sequence where the candidate has the same token."""
    n = min(len(ours), len(theirs))
    return int((ours[:n] == theirs[:n]).sum())


def _logits(candidate: Any, reference: Any, ids: torch.Tensor, generated: torch.Tensor) -> tuple[float, float]:
    """Teacher-forced logits of both models over the reference's generation: max-abs and mean cosine."""
    if not candidate.spec.encodes:
        ours, theirs = candidate(generated).logits, reference(generated).logits
    else:
        ours = candidate(ids, decoder_input_ids=generated).logits
        theirs = reference(ids, decoder_input_ids=generated).logits
    ours, theirs = ours.float()[0], theirs.float()[0]
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).mean()
    return float((ours - theirs).abs().max()), float(cosine)


def _text(model: Any, tokens: torch.Tensor) -> str:
    return model.tokenizer.decode(tokens.tolist(), skip_special_tokens=True).strip()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
