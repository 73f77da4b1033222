"""Verification examples: what each task is checked on, read from a task file or built from plain texts.

One file format per measure (`hotrod.verification.measures`; a task's spec names its measure):

- generation, embeddings: `input[<TAB>target]`;
- labels (text-classification): `text[<TAB>label]`, or `text<TAB>text_pair<TAB>label`; the label must be
  one of the model's;
- ranking (a one-output text-classification head, a cross-encoder): `query<TAB>document[<TAB>score]`,
  grouped by query;
- entities (token-classification): plain texts;
- answers (question-answering): `question<TAB>context[<TAB>answer]`.

A malformed line is one error naming the file and line. Without a file, every measure has built-in examples
made from the built-in sentences (`from_texts`), so any checkpoint verifies on what its task measures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hotrod.errors import HotrodError
from hotrod.verification.inputs import read_lines

DOCUMENTS_PER_QUERY = 4  # built-in reranking groups: one query, this many documents


@dataclass(frozen=True)
class Example:
    """One input and optionally what the task expects of it. `pair` is the second text (a document, a
    context, a text pair); `target` the expected output (a generation, a label, a score, an answer)."""

    text: str
    target: str | None = None
    pair: str | None = None


Parser = Callable[[list[str], Sequence[str]], Example]  # a line's fields and the model's labels -> Example


def read_examples(path: str | Path, parse: Parser, labels: Sequence[str] = ()) -> list[Example]:
    """The examples of a task file, each line read by `parse`; `labels` are the model's, which a labelled
    line must name."""
    examples = []
    for number, line in _numbered_lines(path):
        try:
            examples.append(parse(line.split("\t"), labels))
        except ValueError as exc:
            raise HotrodError(f"{path}:{number}: {exc}") from None
    if not examples:
        raise HotrodError(f"{path} has no examples")
    return examples


def cleaned(texts: Sequence[str]) -> list[str]:
    return [t.strip() for t in texts if t.strip()]


def tab_pairs(texts: Sequence[str]) -> list[Example] | None:
    """`text<TAB>pair` lines as the pairs they are, when every text is one."""
    if texts and all("\t" in t for t in texts):
        return [Example(a.strip(), pair=b.strip()) for a, _, b in (t.partition("\t") for t in texts)]
    return None


def singles(texts: Sequence[str]) -> list[Example]:
    return [Example(t) for t in cleaned(texts)]


def labelled_texts(texts: Sequence[str]) -> list[Example]:
    texts = cleaned(texts)
    return tab_pairs(texts) or [Example(t) for t in texts]


def ranking_texts(texts: Sequence[str]) -> list[Example]:
    texts = cleaned(texts)
    return tab_pairs(texts) or _ranking_groups(texts)


def answer_texts(texts: Sequence[str]) -> list[Example]:
    """Question + context examples: each sentence asked about within it and the sentence before."""
    texts = cleaned(texts)
    return tab_pairs(texts) or ([Example(_question_about(texts[i + 1]), pair=f"{texts[i]} {texts[i + 1]}")
                                 for i in range(len(texts) - 1)] or [Example(_question_about(t), pair=t)
                                                                     for t in texts])


def _ranking_groups(texts: list[str]) -> list[Example]:
    """Each query with the next few texts as its documents (a query in every fifth text)."""
    step = DOCUMENTS_PER_QUERY + 1
    groups = [(texts[i], texts[i + 1:i + step]) for i in range(0, len(texts), step)]
    examples = [Example(query, pair=doc) for query, docs in groups for doc in docs]
    return examples or [Example(t, pair=t) for t in texts]


def _question_about(sentence: str) -> str:
    """A question that shares words with `sentence`, so a real reader finds a span worth answering."""
    words = sentence.rstrip(".?!").split()[:5]
    return f"What about {' '.join(words).lower()}?"


# -- one parser per measure: fields of one line -> Example, or ValueError naming what is wrong ---------


def plain(fields: list[str], labels: Sequence[str]) -> Example:
    text, target = fields[0].strip(), "\t".join(fields[1:]).strip()
    _require(text, "the input is empty")
    return Example(text, target or None)


def labelled(fields: list[str], labels: Sequence[str]) -> Example:
    if len(fields) > 3:
        raise ValueError(f"expected text<TAB>label or text<TAB>text_pair<TAB>label, got {len(fields)} fields")
    text, pair = fields[0].strip(), fields[1].strip() if len(fields) == 3 else None
    label = fields[-1].strip() if len(fields) > 1 else None
    _require(text and (pair is None or pair), "a text is empty")
    if label is not None and label not in labels:
        raise ValueError(f"label {label!r} is not one of the model's labels ({', '.join(labels)})")
    return Example(text, label or None, pair)


def ranked(fields: list[str], labels: Sequence[str]) -> Example:
    if len(fields) not in (2, 3):
        raise ValueError(f"expected query<TAB>document[<TAB>score], got {len(fields)} field(s)")
    query, document = fields[0].strip(), fields[1].strip()
    _require(query and document, "the query or the document is empty")
    score = fields[2].strip() if len(fields) == 3 else None
    if score is not None:
        try:
            float(score)
        except ValueError:
            raise ValueError(f"the score {score!r} is not a number") from None
    return Example(query, score or None, document)


def tagged(fields: list[str], labels: Sequence[str]) -> Example:
    if len(fields) != 1:
        raise ValueError("token-classification examples are plain texts, one per line, without tabs")
    return Example(fields[0].strip())


def answered(fields: list[str], labels: Sequence[str]) -> Example:
    if len(fields) not in (2, 3):
        raise ValueError(f"expected question<TAB>context[<TAB>answer], got {len(fields)} field(s)")
    question, context = fields[0].strip(), fields[1].strip()
    _require(question and context, "the question or the context is empty")
    answer = fields[2].strip() if len(fields) == 3 else None
    return Example(question, answer or None, context)


def _require(condition, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _numbered_lines(path: str | Path) -> list[tuple[int, str]]:
    """(line number, line) of every non-blank line of a UTF-8 file."""
    return [(n, line) for n, line in enumerate(read_lines(path, "examples file"), 1) if line.strip()]
