"""Token classification (NER, POS) as transformers' `pipeline("token-classification")` answers it.

Each token's scores are the softmax of its logits. With aggregation "none" every token not labelled with
an ignored label is an entity of its own; "simple" joins neighbouring tokens of one entity type (a B- tag
starts a new one); "first", "average" and "max" first settle each word's label from its tokens (its first
token's, their mean scores', its most confident token's), then join words the same way. Words and their
character offsets come from the tokenizer's offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotrod.errors import HotrodError, check_choice
from hotrod.pipelines.base import Prepared, Row, check_text, require_task, require_tokenizer
from hotrod.tasks import TOKENS

STRATEGIES = ("none", "simple", "first", "average", "max")
_WORD_STRATEGIES = ("first", "average", "max")


@dataclass
class _Text:
    text: str
    offsets: list[tuple[int, int]]
    special: list[int]


def prepare(model: Any, texts: str | Sequence[str], aggregation_strategy: str = "simple",
            ignore_labels: Sequence[str] = ("O",), truncate: bool = False) -> Prepared:
    require_task(model, TOKENS, "tag")
    tokenizer = require_tokenizer(model, "tag")
    strategy = check_choice("aggregation_strategy", str(aggregation_strategy).lower(), STRATEGIES)
    if not getattr(tokenizer, "is_fast", False):
        raise HotrodError("tag() needs a fast tokenizer: words and character offsets come from its offsets")
    single = isinstance(texts, str)
    items = [texts] if single else list(texts)
    if not items:
        raise HotrodError("nothing to tag")
    rows, states = [], []
    limit = model.dims.max_positions
    for i, text in enumerate(items):
        check_text(text, f"text {i}")
        kwargs = {"truncation": True, "max_length": limit} if truncate and limit else {}
        encoded = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True, **kwargs)
        ids = list(encoded["input_ids"])
        if limit and len(ids) > limit:
            raise HotrodError(f"text {i} has {len(ids)} tokens, more than the model's {limit} positions; "
                              "shorten it or ask for truncation")
        types = encoded.get("token_type_ids") if model.dims.type_vocab_size else None
        rows.append(Row(ids, list(types) if types is not None else None))
        states.append(_Text(text, [tuple(o) for o in encoded["offset_mapping"]], list(encoded["special_tokens_mask"])))
    return Prepared(rows, state=(single, states),
                    options={"strategy": strategy, "ignore": tuple(ignore_labels)})


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
    for index, (token_id, (start, end)) in enumerate(zip(row.input_ids, text.offsets)):
        if text.special[index]:
            continue
        word = tokenizer.convert_ids_to_tokens(int(token_id))
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


def _tag(label: str) -> tuple[str, str]:
    """(B or I, entity type) of a label; a label without a B-/I- prefix continues."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _groups(model: Any, entities: list[dict]) -> list[dict]:
    groups: list[list[dict]] = []
    for entity in entities:
        head, entity_type = _tag(entity["entity"])
        if groups and head != "B" and _tag(groups[-1][-1]["entity"])[1] == entity_type:
            groups[-1].append(entity)
        else:
            groups.append([entity])
    return [{"entity_group": group[0]["entity"].split("-", 1)[-1],
             "score": float(np.nanmean([e["score"] for e in group])),
             "word": model.tokenizer.convert_tokens_to_string([e["word"] for e in group]),
             "start": group[0]["start"], "end": group[-1]["end"]} for group in groups]
