"""Token classification (NER, POS) as transformers' `pipeline("token-classification")` answers it.

Each token's scores are the softmax of its logits. With aggregation "none" every token not labelled with
an ignored label is an entity of its own; "simple" joins neighbouring tokens of one entity type (a B- tag
starts a new one: `groups`); "first", "average" and "max" first settle each word's label from its tokens
(its first token's, their mean scores', its most confident token's), then join words the same way. Words
and their character offsets come from a fast tokenizer's offsets: for word-piece tokenizers a token whose
text is not its characters (`##ing`) continues a word, for others a token not after a space. A slow
tokenizer has no offsets: its entities have no start and end, and the word strategies are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotrod.errors import HotrodError, check_choice
from hotrod.pipelines.base import Prepared, Row, check_text, require_tokenizer, tokenizer_limit, too_long

STRATEGIES = ("none", "simple", "first", "average", "max")
_WORD_STRATEGIES = ("first", "average", "max")  # need words, so a tokenizer that maps tokens to characters


@dataclass
class _Text:
    text: str
    offsets: list[tuple[int, int]] | None  # None from a slow tokenizer: entities without start and end
    special: list[int]


def prepare(model: Any, texts: str | Sequence[str], aggregation_strategy: str | None = "none",
            ignore_labels: Sequence[str] | str | None = ("O",), truncate: bool = False) -> Prepared:
    """`model.tag(...)`: entities as transformers' `pipeline("token-classification")` gives them, for
    aggregation none (the pipeline's default: every token), simple, first, average or max: a list for one
    text, a list of lists for several.
    This makes the rows of one text or a list of texts; a text past the model's positions is refused
    unless `truncate`."""
    tokenizer = require_tokenizer(model, "tag")
    strategy = check_choice("aggregation_strategy", str(aggregation_strategy).lower(), STRATEGIES)
    fast = bool(getattr(tokenizer, "is_fast", False))
    if strategy in _WORD_STRATEGIES and not fast:
        raise HotrodError(f'aggregation_strategy "{strategy}" needs words, and this slow tokenizer cannot handle '
                          'subwords; use "simple" or a fast tokenizer')
    ignored = _labels(ignore_labels)
    single = isinstance(texts, str)
    if not single and not isinstance(texts, Sequence):
        raise HotrodError(f"texts must be a text or a list of texts, got {type(texts).__name__}")
    items = [texts] if single else list(texts)
    if not items:
        raise HotrodError("nothing to tag")
    rows, states = [], []
    limit = tokenizer_limit(model)  # transformers' token-classification pipeline cuts at the tokenizer's limit
    for i, text in enumerate(items):
        check_text(text, f"text {i}")
        kwargs = {"truncation": True, "max_length": limit} if truncate and limit else {}
        encoded = tokenizer(text, return_offsets_mapping=fast, return_special_tokens_mask=True, **kwargs)
        ids = list(encoded["input_ids"])
        if limit and len(ids) > limit:
            raise too_long(model, f"text {i}", len(ids), limit, truncatable=not truncate)
        types = encoded.get("token_type_ids") if model.dims.type_vocab_size else None
        rows.append(Row(ids, list(types) if types is not None else None))
        offsets = [tuple(o) for o in encoded["offset_mapping"]] if fast else None
        states.append(_Text(text, offsets, list(encoded["special_tokens_mask"])))
    return Prepared(rows, state=(single, states), options={"strategy": strategy, "ignore": ignored})


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> list:
    """Each text's entities (one list for one text, as the pipeline answers)."""
    single, states = prepared.state
    answers = [_entities(model, row, state, out["logits"].float().numpy(), prepared.options)
               for row, state, out in zip(prepared.rows, states, outputs)]
    return answers[0] if single else answers


def _entities(model: Any, row: Row, text: _Text, logits: np.ndarray, options: dict) -> list[dict]:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    scores = shifted / shifted.sum(axis=-1, keepdims=True)
    tokens = _tokens(model, row, text, scores)
    strategy = options["strategy"]
    if strategy in _WORD_STRATEGIES:
        found = [_word(model, group, strategy) for group in _words(tokens)]
    else:
        found = [_labelled(model, token) for token in tokens]
    if strategy != "none":
        found = _groups(model, found)
    ignore = options["ignore"]
    return [e for e in found if e.get("entity") not in ignore and e.get("entity_group") not in ignore]


def _tokens(model: Any, row: Row, text: _Text, scores: np.ndarray) -> list[dict]:
    """The non-special tokens with their scores, text span and whether they continue a word."""
    tokenizer = model.tokenizer
    wordpiece = getattr(getattr(getattr(tokenizer, "_tokenizer", None), "model", None), "continuing_subword_prefix", None)
    tokens = []
    for index, token_id in enumerate(row.input_ids):
        if text.special[index]:
            continue
        word = tokenizer.convert_ids_to_tokens(int(token_id))
        start = end = None
        continuing = False
        if text.offsets is not None:
            start, end = text.offsets[index]
            span = text.text[start:end]
            if wordpiece:
                continuing = len(word) != len(span)
            else:  # no subword marker: a token not after a space continues the word before it
                continuing = start > 0 and " " not in text.text[start - 1: start + 1]
            if int(token_id) == tokenizer.unk_token_id:
                word, continuing = span, False
        tokens.append({"word": word, "scores": scores[index], "start": start, "end": end, "index": index,
                       "continuing": continuing})
    return tokens


def _labelled(model: Any, token: dict) -> dict:
    best = int(token["scores"].argmax())
    return {"entity": model.labels[best], "score": float(token["scores"][best]), "index": token["index"],
            "word": token["word"], "start": token["start"], "end": token["end"]}


def _words(tokens: list[dict]) -> list[list[dict]]:
    words: list[list[dict]] = []
    for token in tokens:
        if words and token["continuing"]:
            words[-1].append(token)
        else:
            words.append([token])
    return words


def _word(model: Any, tokens: list[dict], strategy: str) -> dict:
    """One word's label from its tokens' scores."""
    if strategy == "first":
        scores = tokens[0]["scores"]
    elif strategy == "max":
        scores = max(tokens, key=lambda t: t["scores"].max())["scores"]
    else:
        scores = np.nanmean(np.stack([t["scores"] for t in tokens]), axis=0)
    best = int(scores.argmax())
    return {"entity": model.labels[best], "score": float(scores[best]),
            "word": model.tokenizer.convert_tokens_to_string([t["word"] for t in tokens]),
            "start": tokens[0]["start"], "end": tokens[-1]["end"]}


def split_tag(label: str) -> tuple[str, str]:
    """(B or I, entity type) of a label; a label without a B-/I- prefix continues ("I") itself."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def group_name(label: str) -> str:
    """The entity_group of a group whose first label is `label`: what follows its first "-"."""
    return label.split("-", 1)[-1]


def groups(labels: Sequence[str]) -> list[list[int]]:
    """Indexes of the labels that make each entity, as "simple" groups them: a label joins the group before
    it when it has the type of the group's last label and is not a B-. Verification groups the source's
    and the candidate's tags through this too, so its entities are the ones `tag` answers."""
    found: list[list[int]] = []
    for index, label in enumerate(labels):
        head, entity_type = split_tag(label)
        if found and head != "B" and split_tag(labels[found[-1][-1]])[1] == entity_type:
            found[-1].append(index)
        else:
            found.append([index])
    return found


def _groups(model: Any, entities: list[dict]) -> list[dict]:
    members = [[entities[i] for i in group] for group in groups([e["entity"] for e in entities])]
    return [{"entity_group": group_name(group[0]["entity"]),
             "score": float(np.nanmean([e["score"] for e in group])),
             "word": model.tokenizer.convert_tokens_to_string([e["word"] for e in group]),
             "start": group[0]["start"], "end": group[-1]["end"]} for group in members]


def _labels(ignore_labels: Any) -> tuple[str, ...]:
    """The labels left out: the pipeline's ["O"] for None, one label, or a list of them."""
    if ignore_labels is None:
        return ("O",)
    if isinstance(ignore_labels, str):
        return (ignore_labels,)
    labels = tuple(ignore_labels) if isinstance(ignore_labels, Iterable) else None
    if labels is None or not all(isinstance(label, str) for label in labels):
        raise HotrodError(f"ignore_labels must be a list of label names, got {ignore_labels!r}")
    return labels
