"""Reranking with a cross-encoder: each (query, document) pair's score as sentence-transformers'
`CrossEncoder.predict` gives it, and the documents best first as `CrossEncoder.rank` orders them.

The score is the one-output head's logit through the activation CrossEncoder applies by default: the torch
module the config names (`sentence_transformers.activation_fn`, written by sentence-transformers when it
saves a model, or the older `sbert_ce_default_activation_function`; read by `hotrod.pipelines.activation`,
which classify shares), else a sigmoid. As CrossEncoder does without `trust_remote_code`, a path outside
torch falls back to the sigmoid. The server's rerank routes rank through here too, so they answer what
`model.rerank` answers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from hotrod.errors import HotrodError, check_choice
from hotrod.pipelines import classify
from hotrod.pipelines.activation import apply_activation, cross_encoder_activation, cross_encoder_prompt
from hotrod.pipelines.base import Prepared, check_text, encode, require_tokenizer, tokenizer_limit


def prepare(model: Any, query: str, documents: Sequence[str], top_n: int | None = None,
            truncate: bool = False, function: str | None = None, *, prompt_name: str | None = None,
            prompt: str | None = None) -> Prepared:
    """`model.rerank(...)`: documents by a cross-encoder's score for (query, document), best first, as
    [{"index", "score"}], the score as sentence-transformers' `CrossEncoder.predict` gives it (its prompt,
    `prompt` or `prompt_name` or the checkpoint's default, before the query); this makes one row per
    (query, document) pair. `function` replaces the cross-encoder's own activation with one of classify's
    (softmax, sigmoid, none), for callers that promise another score (TEI's raw scores)."""
    require_tokenizer(model, "rerank")
    check_text(query, "the query")
    query = cross_encoder_prompt(model.config, prompt, prompt_name) + query
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise HotrodError("documents must be a list of texts")
    if not documents:
        raise HotrodError("no documents to rerank")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise HotrodError(f"top_n must be a whole number >= 1 or None, got {top_n!r}")
    texts = [check_text(doc, f"document {i}") for i, doc in enumerate(documents)]
    if function is None:
        activation = cross_encoder_activation(model.config)
        activation = torch.nn.Sigmoid() if activation is None else activation
    else:
        name = check_choice("function_to_apply", str(function).lower(), classify.FUNCTIONS)
        activation = functools.partial(classify.apply, function=name)
    # CrossEncoder cuts at its max_length, which it saves as the tokenizer's model_max_length
    rows = encode(model, [query] * len(texts), texts, truncate=truncate, what="document", limit=tokenizer_limit(model))
    return Prepared(rows, options={"top_n": top_n, "activation": activation})


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> list[dict]:
    """[{"index", "score"}] best first (equal scores keep the documents' order), the first top_n."""
    activation = prepared.options["activation"]
    scores = [float(apply_activation(activation, out["logits"])[0]) for out in outputs]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: prepared.options["top_n"]]
    return [{"index": i, "score": scores[i]} for i in order]
