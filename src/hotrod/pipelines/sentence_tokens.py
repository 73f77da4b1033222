"""Tokenization for embeddings as sentence-transformers' Transformer module does it: the prompt before each
text, lowercased where the checkpoint says, cut at its max_seq_length; the prompt's length kept for pooling
that leaves the prompt out. `model.embed` and the server (on its tokenizer thread) both tokenize here, so a
served vector is the API's."""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

from hotrod.errors import HotrodError
from hotrod.model_inputs import embed_rows
from hotrod.pipelines.base import tokenizer_limit


@dataclass(frozen=True)
class Tokenized:
    """Rows already tokenized by `tokenize` (a server does it on its tokenizer thread, ahead of the batch),
    with the prompt's length in tokens, which pooling that leaves the prompt out needs."""

    rows: list[list[int]]
    prompt_length: int = 0


def tokenize(model: Any, texts: list[str], prompt: str | None, truncate: bool = True,
             side: str = "right") -> Tokenized:
    """Token rows of the prompted texts as sentence-transformers' Transformer makes them (lowercased where the
    checkpoint says, cut to its max_seq_length), and the prompt's length in tokens without a trailing special
    token (`_get_prompt_length`). Without `truncate` a text past that length is refused (a server's
    `truncate: false`); `side` "left" keeps a text's end instead of its start (TEI's truncation_direction)."""
    if model.tokenizer is None:
        raise HotrodError("this model has no tokenizer; pass token ids instead of text")
    tokenizer = sentence_tokenizer(model)
    if any(not t.strip() for t in texts):
        raise HotrodError("empty text")
    if side not in ("right", "left"):
        raise HotrodError(f"unknown truncation side {side!r}; choose right or left")
    limit = max_length(model)
    prompt = prompt or None  # an empty prompt is none
    texts = [(prompt or "") + t for t in texts]
    if model.sentence is not None and model.sentence.do_lower_case and tokenizer is model.tokenizer:  # a slow one
        texts, prompt = [t.lower() for t in texts], prompt.lower() if prompt else prompt
    cut = truncate and limit is not None
    rows = _encode(tokenizer, texts, cut, limit, side)
    if limit is not None and not cut:
        for i, row in enumerate(rows):
            if len(row) > limit:
                raise HotrodError(f"text {i} has {len(row)} tokens; this model embeds at most {limit}; send "
                                  f"truncate: true to cut it")
    prompt_length = 0
    if prompt:
        ids = tokenizer([prompt], truncation=limit is not None, max_length=limit)["input_ids"][0]
        prompt_length = len(ids) - (1 if ids and ids[-1] in tokenizer.all_special_ids else 0)
    return Tokenized(embed_rows([list(r) for r in rows], tokenizer, model.dims), prompt_length)


_LOWERCASING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sentence_tokenizer(model: Any) -> Any:
    """The tokenizer sentence-transformers' Transformer module runs: the model's, with a Lowercase normalizer put
    first where the checkpoint says do_lower_case (as sentence-transformers does to a fast tokenizer: letter by
    letter, after special tokens are split off, so "[SEP]" in a text stays the special token), made once."""
    tokenizer = model.tokenizer
    if model.sentence is None or not model.sentence.do_lower_case or not getattr(tokenizer, "is_fast", False):
        return tokenizer  # a slow tokenizer: the texts are lowercased instead (`tokenize`)
    made = _LOWERCASING.get(tokenizer)
    if made is None:
        from tokenizers.normalizers import Lowercase, Sequence

        made = copy.deepcopy(tokenizer)
        existing = made.backend_tokenizer.normalizer
        kept = list(existing) if isinstance(existing, Sequence) else [] if existing is None else [existing]
        if not any(isinstance(step, Lowercase) for step in kept):
            made.backend_tokenizer.normalizer = Sequence([Lowercase(), *kept])
        _LOWERCASING[tokenizer] = made
    return made


def _encode(tokenizer: Any, texts: list[str], cut: bool, limit: int | None, side: str) -> list[list[int]]:
    """The tokenizer's rows, cut at `limit` on `side` when `cut`. transformers takes the side as the
    tokenizer's attribute only, so it is set for this call and put back."""
    kept = getattr(tokenizer, "truncation_side", "right")
    if cut and side != kept:
        tokenizer.truncation_side = side
    try:
        return tokenizer(texts, truncation=cut, max_length=limit if cut else None)["input_ids"]
    finally:
        if cut and side != kept:
            tokenizer.truncation_side = kept


def max_length(model: Any) -> int | None:
    """Where texts are cut: the checkpoint's max_seq_length; else the tokenizer's limit capped at the positions,
    as sentence-transformers' Transformer module makes it for its checkpoints and for a plain one alike."""
    positions = model.dims.max_positions or None
    pipe = model.sentence
    if pipe is not None and pipe.max_seq_length is not None:
        return min(pipe.max_seq_length, positions) if positions else pipe.max_seq_length
    return tokenizer_limit(model)
