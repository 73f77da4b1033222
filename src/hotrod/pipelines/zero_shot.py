"""Zero-shot classification with an NLI head, as transformers' `pipeline("zero-shot-classification")`
answers it: each (text, candidate label) is posed as a premise and the hypothesis the template makes of
the label, and the head's entailment logit says how well the label fits.

Every pair of a call is one row of one batch (the pipeline runs them one by one; the answer is the same).
Scores: a softmax of the entailment logits over the labels, or, for `multi_label` (or a single label),
each label's own softmax of [contradiction, entailment]. The entailment output is the first label2id key
that starts with "entail" (any case), and contradiction the first output, or the last when entailment is
the first: transformers' choices, so an NLI checkpoint answers here what it answers there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotrod.errors import HotrodError
from hotrod.pipelines.base import Prepared, check_text, encode, require_tokenizer, tokenizer_limit

DEFAULT_TEMPLATE = "This example is {}."
MAX_LABELS = 100  # candidate labels per call: each is one row per text, so a call runs texts x labels rows
NEEDS = "an NLI head with an entailment label (a label2id key starting with 'entail')"


def has_entailment(labels: Sequence[str]) -> bool:
    """Whether a head with these labels can answer zero-shot: one of them is entailment, as the pipeline
    looks for it."""
    return any(str(label).lower().startswith("entail") for label in labels)


def prepare(model: Any, sequences: str | Sequence[str], candidate_labels: str | Sequence[str],
            hypothesis_template: str = DEFAULT_TEMPLATE, multi_label: bool = False,
            truncate: bool = False) -> Prepared:
    """`model.zero_shot(...)`: each text's candidate labels best first, as transformers'
    `pipeline("zero-shot-classification")` gives them: {"sequence", "labels", "scores"} for one text, a list
    of them for a list. `candidate_labels` is a list or a comma-separated string; `hypothesis_template` has
    {} where a label goes; `multi_label` scores each label on its own (entailment against contradiction)
    instead of sharing one softmax among them. A text too long for the model beside a hypothesis is refused
    unless `truncate` (then the text is cut, never the hypothesis). This makes one row per (text, label)."""
    require_tokenizer(model, "zero_shot")
    entailment = _entailment_id(model.config)
    labels = parse_labels(candidate_labels)
    hypotheses = [_hypothesis(hypothesis_template, label) for label in labels]
    if not isinstance(multi_label, bool):
        raise HotrodError(f"multi_label must be true or false, got {multi_label!r}")
    single = isinstance(sequences, str)
    if not single and (not isinstance(sequences, Sequence) or isinstance(sequences, bytes)):
        raise HotrodError(f"the texts must be a text or a list of texts, got {type(sequences).__name__}")
    texts = [sequences] if single else list(sequences)
    if not texts:
        raise HotrodError("no texts to classify")
    texts = [check_text(text, "the text" if single else f"text {i}") for i, text in enumerate(texts)]
    names = [f"{'the text' if single else f'text {i}'} with candidate label {label!r}"
             for i in range(len(texts)) for label in labels]
    rows = encode(model, [text for text in texts for _ in labels], hypotheses * len(texts), truncate=truncate,
                  cut="only_first", names=names, limit=tokenizer_limit(model))  # where the pipeline cuts
    contradiction = model.dims.num_labels - 1 if entailment == 0 else 0
    return Prepared(rows, state=(single, texts, labels),
                    options={"multi_label": multi_label, "entailment": entailment, "contradiction": contradiction})


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> dict | list[dict]:
    """Each text's {"sequence", "labels", "scores"}, labels best first (in the pipeline's order for ties)."""
    single, texts, labels = prepared.state
    options = prepared.options
    logits = torch.stack([out["logits"].float() for out in outputs]).reshape(len(texts), len(labels), -1)
    if options["multi_label"] or len(labels) == 1:
        pair = logits[..., [options["contradiction"], options["entailment"]]]
        scores = torch.softmax(pair, dim=-1)[..., 1]
    else:
        scores = torch.softmax(logits[..., options["entailment"]], dim=-1)
    answers = []
    for text, row in zip(texts, scores.numpy()):
        order = row.argsort()[::-1]  # numpy's sort, reversed, as the pipeline orders labels
        answers.append({"sequence": text, "labels": [labels[i] for i in order],
                        "scores": [float(row[i]) for i in order]})
    return answers[0] if single else answers


def parse_labels(candidate_labels: str | Sequence[str]) -> list[str]:
    """The candidate labels: a list of texts, or one text of comma-separated labels (as the pipeline reads
    it); none, too many, or one that is not a text is one line naming `candidate_labels`."""
    if isinstance(candidate_labels, str):
        labels = [label.strip() for label in candidate_labels.split(",") if label.strip()]
    elif isinstance(candidate_labels, Sequence):
        labels = [check_text(label, f"candidate_labels[{i}]") for i, label in enumerate(candidate_labels)]
    else:
        raise HotrodError(f"candidate_labels must be a list of labels or a comma-separated text, got "
                          f"{type(candidate_labels).__name__}")
    if not labels:
        raise HotrodError("candidate_labels is empty; give at least one label")
    if len(labels) > MAX_LABELS:
        raise HotrodError(f"candidate_labels has {len(labels)} labels, more than the {MAX_LABELS} a call takes")
    return labels


def _hypothesis(template: Any, label: str) -> str:
    """The template with the label put in; a template without a place for it is refused, as the pipeline
    refuses one that the label does not change."""
    if not isinstance(template, str):
        raise HotrodError(f"hypothesis_template must be a string, got {type(template).__name__}")
    try:
        made = template.format(label)
    except (IndexError, KeyError, ValueError):
        made = None
    if made is None or made == template:
        raise HotrodError(f"hypothesis_template {template!r} has no place for the label; put {{}} where it goes, "
                          "as in 'This example is {}.'")
    return made


def _entailment_id(config: Any) -> int:
    """The entailment output: the first label2id key that starts with "entail", as the pipeline finds it."""
    label2id = getattr(config, "label2id", None) or {}
    for label, index in label2id.items():
        if str(label).lower().startswith("entail"):
            return int(index)
    raise HotrodError(f"zero_shot() needs {NEEDS}; this one's labels are {', '.join(map(str, label2id)) or 'none'}")
