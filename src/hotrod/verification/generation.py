"""Language models: teacher-forced logits, greedy token agreement, exact match of whole generations, and
task exact match of both sides where examples carry targets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.verification.examples import Example


def compare_generations(candidate: Any, reference: Any, rows: list[torch.Tensor], examples: Sequence[Example],
                        max_new_tokens: int | None) -> dict:
    kwargs = {"do_sample": False, "num_beams": 1}
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    max_abs, cosines, agree, total, exact = 0.0, [], 0, 0, 0
    task = {"ours": 0, "source": 0, "n": 0}
    for ids, example in zip(rows, examples):
        mask = torch.ones_like(ids)
        within = _within_positions(candidate, ids.shape[1], kwargs)
        theirs = reference.generate(ids, attention_mask=mask, **within)
        ours = candidate.generate(ids, attention_mask=mask, **within)
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


def _within_positions(model: Any, prompt: int, kwargs: dict) -> dict:
    """`kwargs` with the new tokens cut to what the model's positions leave after a `prompt`-token row: a
    verification text tokenized long by a small model's vocabulary must not fail the build."""
    positions = model.dims.max_positions
    if positions is None:
        return kwargs
    from hotrod.generation import config as gen_config

    wanted = kwargs.get("max_new_tokens") or gen_config.merge(model.generation_config, None, {})["max_new_tokens"]
    if wanted is None or prompt + wanted <= positions:
        return kwargs
    return {**kwargs, "max_new_tokens": max(1, positions - prompt)}
