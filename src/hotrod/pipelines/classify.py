"""Sequence classification as transformers' `pipeline("text-classification")` answers it, and the scores
that `model.rerank` ranks by.

Scores are the logits through the function the pipeline picks: none for regression, sigmoid for
multi-label heads and one-output heads, softmax otherwise (or the one asked for). A sentence-transformers
cross-encoder's checkpoint (its config records the activation CrossEncoder applies) scores as
`CrossEncoder(path).predict` does instead: its logits through that activation, unless a function is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.errors import HotrodError, check_choice
from hotrod.pipelines.activation import Activation, apply_activation, cross_encoder_activation, cross_encoder_prompt
from hotrod.pipelines.base import Prepared, check_text, encode, require_tokenizer

FUNCTIONS = ("softmax", "sigmoid", "none")

Input = str | Sequence[str] | dict  # a text, a (text, text_pair) pair, or {"text", "text_pair"}


class _NotGiven:
    def __repr__(self) -> str:
        return "not given"


# top_k not given: the pipeline's own answer without one (each input's best label, a bare dict for one pair),
# which differs in shape from top_k=1's (each input's list of one label)
NOT_GIVEN: Any = _NotGiven()


def prepare(model: Any, inputs: Input | Sequence[Input], top_k: int | None = NOT_GIVEN,
            function_to_apply: str | None = None, truncate: bool = False, *, prompt_name: str | None = None,
            prompt: str | None = None) -> Prepared:
    """`model.classify(...)`: labels and scores as transformers' `pipeline("text-classification")` gives them,
    in its shapes (top_k not given: each input's best label; a number: each input's list of that many; None:
    every label). Inputs: a text, a (text, text_pair) pair, or a list of either; this makes their rows. A
    cross-encoder's checkpoint, asked for no function, scores as `CrossEncoder.predict` (its own activation,
    no softmax; its prompt, `prompt` or `prompt_name` or its saved default, before each first text), so the
    same checkpoint answers alike in both."""
    require_tokenizer(model, "classify")
    legacy = top_k is NOT_GIVEN
    top_k = 1 if legacy else top_k
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise HotrodError(f"top_k must be a whole number >= 1 or None, got {top_k!r}")
    function: str | Activation
    if function_to_apply is not None:
        function = check_choice("function_to_apply", str(function_to_apply).lower(), FUNCTIONS)
    else:
        activation = cross_encoder_activation(model.config)
        function = default_function(model.config) if activation is None else activation
    single = _is_one(inputs)
    if not single and not isinstance(inputs, list | tuple):
        raise HotrodError(f"inputs must be a text, a (text, text_pair), or a list of them; got {type(inputs).__name__}")
    items = [inputs] if single else list(inputs)
    if not items:
        raise HotrodError("nothing to classify")
    before = cross_encoder_prompt(model.config, prompt, prompt_name)  # a CrossEncoder's, before each first text
    pairs = [(before + first, second) for first, second in (_pair(item, i) for i, item in enumerate(items))]
    if all(second is None for _, second in pairs):
        rows = encode(model, [first for first, _ in pairs], truncate=truncate)
    elif any(second is None for _, second in pairs):
        raise HotrodError("inputs mix single texts and text pairs; classify one kind at a time")
    else:
        rows = encode(model, [a for a, _ in pairs], [b for _, b in pairs], truncate=truncate, what="pair")
    one = ("text" if isinstance(inputs, str) else "pair") if single else None
    return Prepared(rows, state=one, options={"top_k": top_k, "legacy": legacy, "function": function})


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> Any:
    """The pipeline's answer: top_k not given, the best label of each input (for one input, a list of one, or
    the bare label for one pair); otherwise each input's top_k labels (every label for None), best first (for
    one input, its list)."""
    top_k, function, legacy = prepared.options["top_k"], prepared.options["function"], prepared.options["legacy"]
    answers: list = []
    for out in outputs:
        logits = out["logits"].float()
        scores = apply(logits, function) if isinstance(function, str) else apply_activation(function, logits)
        if legacy:
            best = int(scores.argmax())
            answers.append({"label": model.labels[best], "score": float(scores[best])})
            continue
        ranked = sorted(({"label": model.labels[i], "score": float(s)} for i, s in enumerate(scores)),
                        key=lambda entry: entry["score"], reverse=True)
        answers.append(ranked if top_k is None else ranked[:top_k])
    one = prepared.state  # "text" or "pair" for one input; None (or False) for a list
    if not one or (legacy and one == "text"):
        return answers
    return answers[0]


def default_function(config) -> str:
    """The function transformers' pipeline applies when none is asked for."""
    problem = getattr(config, "problem_type", None)
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


def apply(logits: torch.Tensor, function: str) -> torch.Tensor:
    """The logits through one of FUNCTIONS by name, as the pipeline's `function_to_apply` names them."""
    if function == "sigmoid":
        return torch.sigmoid(logits)
    if function == "softmax":
        return torch.softmax(logits, dim=-1)
    return logits


def _is_one(inputs: Any) -> bool:
    """One text, one {"text", "text_pair"}, or one (text, text_pair) of two strings."""
    if isinstance(inputs, str | dict):
        return True
    return isinstance(inputs, tuple) and len(inputs) == 2 and all(isinstance(t, str) for t in inputs)


def _pair(item: Any, index: int) -> tuple[str, str | None]:
    """(text, text_pair or None) of one input; a pair with a side missing is one line naming it."""
    if isinstance(item, str):
        return check_text(item, f"text {index}"), None
    if isinstance(item, dict):
        unknown = set(item) - {"text", "text_pair"}
        if unknown:
            raise HotrodError(f"input {index} has unknown key(s) {', '.join(sorted(unknown))}; use text, text_pair")
        text = check_text(item.get("text"), f"input {index}'s text")
        pair = item.get("text_pair")
        return text, None if pair is None else check_text(pair, f"input {index}'s text_pair")
    if isinstance(item, list | tuple):
        if len(item) != 2:
            raise HotrodError(f"input {index} is a pair of {len(item)} texts; a pair has two")
        return check_text(item[0], f"pair {index}'s first text"), check_text(item[1], f"pair {index}'s second text")
    raise HotrodError(f"input {index} must be a text or a pair of texts, got {type(item).__name__}")
