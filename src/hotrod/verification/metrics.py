"""The task metrics, as pure functions of two models' answers (or of an answer and a target).

- answers: exact match and F1 of normalized text, as the SQuAD v1.1 evaluation script computes them
  (lower case, no punctuation, no articles, whitespace collapsed; F1 over the bag of tokens);
- entities: micro F1 over (label, start, end) triples, the source's entities taken as the truth;
- rankings: pairwise order agreement, the share of a group's item pairs that both rankings order the same
  way (Kendall's tau moved to [0, 1]: one swapped neighbour pair among five items is 0.9, not Spearman's
  0.9 nor tau's 0.8); pooled over every pair of every group, so a few large groups do not hide in the mean.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalization: what differs only in case, punctuation or articles is the same answer."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_exact(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def answer_f1(prediction: str, truth: str) -> float:
    """Token-overlap F1 of two answers after normalization (SQuAD v1.1's `f1_score`)."""
    ours, theirs = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not ours or not theirs:
        return float(ours == theirs)  # two empty answers agree; one empty answer shares nothing
    common = sum((Counter(ours) & Counter(theirs)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(ours), common / len(theirs)
    return 2 * precision * recall / (precision + recall)


def entity_f1(ours: Iterable[Iterable[Hashable]], theirs: Iterable[Iterable[Hashable]]) -> tuple[float, float, float]:
    """Micro precision, recall and F1 of entity sets, per example in parallel lists; no entities on
    either side is full agreement."""
    found = truth = hits = 0
    for mine, reference in zip(ours, theirs, strict=True):
        mine, reference = set(mine), set(reference)
        found, truth, hits = found + len(mine), truth + len(reference), hits + len(mine & reference)
    precision = hits / found if found else float(not truth)
    recall = hits / truth if truth else float(not found)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def order_agreement(groups: Iterable[tuple[Sequence[float], Sequence[float]]]) -> float:
    """Share of within-group item pairs ordered alike by both score lists; a pair the reference ties
    counts as agreed when the candidate ties it too. A group of one item has no pairs (1.0 overall
    when no group has any)."""
    agreed = total = 0
    for ours, theirs in groups:
        for i in range(len(theirs)):
            for j in range(i + 1, len(theirs)):
                agreed += _sign(ours[i] - ours[j]) == _sign(theirs[i] - theirs[j])
                total += 1
    return agreed / total if total else 1.0


def top1_agreement(groups: Iterable[tuple[Sequence[float], Sequence[float]]]) -> float:
    """Share of groups whose best item is the same for both score lists."""
    pairs = [(max(range(len(o)), key=o.__getitem__), max(range(len(t)), key=t.__getitem__)) for o, t in groups]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else 1.0


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)
