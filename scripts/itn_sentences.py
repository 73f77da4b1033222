"""Sentences for the inverse-text-normalization demo task: running text whose numbers are spelled out.

The target is the same sentence with each spelled-out number written in digits, so most of every answer is
copied from its input: the workload prompt lookup and assisted decoding are meant for (an editor's
corrections, a summary quoting its source, code edits). Sentences are built from a small grammar so that the
held-out set is made of combinations training never saw, not of memorized sentences.
"""

from __future__ import annotations

import random
from collections.abc import Callable

SUBJECTS = ["the shop", "my sister", "our team", "the farmer", "the library", "she", "he", "they", "the company",
            "my neighbour", "the museum", "a student", "the city", "our school", "the bakery", "grandpa",
            "the captain", "the club", "the old man", "her cousin", "the new chef", "a volunteer"]
VERBS = ["sold", "bought", "ordered", "counted", "found", "shipped", "lost", "painted", "planted", "collected",
         "donated", "packed", "repaired", "borrowed", "printed", "delivered", "cleaned", "sorted"]
NOUNS = ["apples", "books", "chairs", "tickets", "boxes", "bottles", "trees", "coins", "letters", "lamps",
         "bikes", "shirts", "candles", "maps", "stamps", "cakes", "photos", "plates", "blankets", "pencils"]
PLACES = ["at the market", "near the river", "in the village", "behind the station", "for the school",
          "at the harbour", "in the old town", "for the festival", "by the bridge", "in the garden"]
TIMES = ["last week", "on monday", "in march", "before noon", "this year", "yesterday", "in the morning",
         "after the storm", "during the sale", "on the first day", "late at night", "every summer"]
JOINERS = ["and then", "because", "while", "so", "but", "after"]

# A clause has a number (drawn by the caller) or not; each {n} below is replaced by one spelled-out number.
NUMBERED = ["{s} {v} {n} {o} {p}", "{s} {v} {n} {o} {t}", "{s} {v} {n} {o} {p} {t}",
            "{s} waited {n} minutes {p}", "{s} walked {n} miles {t}", "{s} paid {n} dollars for the {o} {t}"]
PLAIN = ["{s} {v} the {o} {p}", "{s} {v} the {o} {t}", "{s} {v} some {o} {p} {t}", "{s} went home {t}"]


def random_small_number(rng: random.Random) -> int:
    """0..9999, mostly of one or two digits (0.4 each, then 0.1 each for three and four): numbers as they
    appear in running text."""
    digits = rng.choices((1, 2, 3, 4), weights=(4, 4, 1, 1))[0]
    return rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def _clause(template: str, rng: random.Random) -> tuple[str, tuple]:
    slots = {"s": rng.choice(SUBJECTS), "v": rng.choice(VERBS), "o": rng.choice(NOUNS),
             "p": rng.choice(PLACES), "t": rng.choice(TIMES)}
    return template, tuple(sorted(slots.items()))


def random_sentence(rng: random.Random) -> tuple:
    """A sentence as a value: three clauses (one with a number, the others with one at times) joined by
    words, and the numbers. The value, not its rendering, is what the held-out set keeps apart from training.
    """
    clauses = [_clause(rng.choice(NUMBERED), rng)]
    clauses += [_clause(rng.choice(NUMBERED if rng.random() < 0.25 else PLAIN), rng) for _ in range(2)]
    rng.shuffle(clauses)
    count = sum(template.count("{n}") for template, _ in clauses)
    numbers = tuple(random_small_number(rng) for _ in range(count))
    return tuple(clauses), (rng.choice(JOINERS), rng.choice(JOINERS)), numbers


def render(value: tuple, say: Callable[[int, random.Random], str], rng: random.Random) -> tuple[str, str]:
    """(the sentence with its numbers in words, the same sentence with them in digits)."""
    clauses, joiners, numbers = value
    spoken, written = [], []
    queue = list(numbers)
    for template, slots in clauses:
        fields = dict(slots)
        if "{n}" in template:
            n = queue.pop(0)
            spoken.append(template.format(n=say(n, rng), **fields))
            written.append(template.format(n=str(n), **fields))
        else:
            spoken.append(template.format(**fields))
            written.append(spoken[-1])
    first, second, third = spoken
    one, two, three = written
    return f"{first} {joiners[0]} {second} {joiners[1]} {third} =", f"{one} {joiners[0]} {two} {joiners[1]} {three}"
