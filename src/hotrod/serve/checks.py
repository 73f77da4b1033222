"""The checks a request's inputs must pass before it takes a slot: the 4xx answers a schema cannot give.

They need the served model (its vocabulary, positions, kind) or the server's limits, and they run in
order of cost: counts and bytes first, then tokenizing (on the model's tokenizer thread, never on the
event loop), then token counts. A text longer than `BYTES_PER_TOKEN` bytes per allowed token is refused
without being tokenized at all, so a 4 MB prompt costs a comparison, not a tokenizer run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

from fastapi import Request

from hotrod.errors import HotrodError, first_line
from hotrod.generation import draft_rules
from hotrod.kinds import spec
from hotrod.serve.http_errors import ApiError
from hotrod.serve.limits import BYTES_PER_TOKEN
from hotrod.serve.messages import Worker
from hotrod.serve.schemas import CompletionRequest, Sampling, Speculate

DEFAULT_NEW_TOKENS = 32
Item = str | list[int]


def exactly_one(text: Any, ids: Any, text_param: str, ids_param: str) -> str:
    """The name of the one prompt field given, refusing none or both."""
    if (text is None) == (ids is None):
        raise ApiError(400, f"{text_param}: give exactly one of {text_param} and {ids_param}", text_param)
    return text_param if text is not None else ids_param


def input_limit(request: Request, worker: Worker) -> int:
    """The most tokens one prompt or embedding input may have on this server, for this model."""
    return request.app.state.limits.input_tokens(worker.info.max_positions)


async def token_rows(request: Request, worker: Worker, items: Sequence[Item], param: str,
                     wheres: Sequence[str] | None = None) -> list[list[int]]:
    """Token ids of texts or id rows, each refused when empty, too long or outside the vocabulary."""
    wheres = wheres or [param] * len(items)
    limit = input_limit(request, worker)
    texts = {}
    for i, (item, where) in enumerate(zip(items, wheres)):
        if isinstance(item, str):
            check_bytes(item, limit, where, param)
            texts[i] = item
    encoded = await _encode(request, worker, list(texts.values()), param) if texts else []
    by_index = dict(zip(texts, encoded))
    rows = [by_index.get(i, item) for i, item in enumerate(items)]
    for row, where in zip(rows, wheres):
        check_token_row(worker, row, limit, where, param)
    return rows  # type: ignore[return-value]


async def token_ids(request: Request, worker: Worker, item: Item, param: str) -> list[int]:
    """One prompt's token ids (see `token_rows`)."""
    return (await token_rows(request, worker, [item], param))[0]


def check_bytes(text: str, limit: int, where: str, param: str) -> None:
    budget = limit * BYTES_PER_TOKEN
    if len(text) > budget or len(text.encode("utf-8")) > budget:  # encodable: the door refused lone surrogates
        raise ApiError(400, f"{where}: the text is longer than this server takes ({budget} bytes for a limit of "
                            f"{limit} tokens); shorten it", param)


async def _encode(request: Request, worker: Worker, texts: list[str], param: str) -> list[list[int]]:
    """Tokenize on the model's own tokenizer thread: off the event loop, and one thread per tokenizer."""
    pool: Executor = request.app.state.tokenizers[worker.info.name]
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, _encode_all, worker, texts)
    except HotrodError as exc:
        raise ApiError(400, f"{param}: {first_line(exc)}", param) from None


def check_token_count(count: int, limit: int, where: str, param: str) -> None:
    if count > limit:
        raise ApiError(400, f"{where}: {count} tokens; this server takes at most {limit} tokens per input "
                            f"for this model", param)


def _encode_all(worker: Worker, texts: list[str]) -> list[list[int]]:
    return [worker.encode(text) if text else [] for text in texts]


def check_token_row(worker: Worker, ids: list[int], limit: int, where: str, param: str) -> None:
    if not ids:
        raise ApiError(400, f"{where}: the input is empty", param)
    check_token_count(len(ids), limit, where, param)
    vocab = worker.info.vocab_size
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise ApiError(400, f"{where}: token id {bad} is outside the vocabulary [0, {vocab})", param)


def new_tokens(request: Request, worker: Worker, prompt: list[int], new: int | None, where: str, param: str) -> int:
    """How many tokens to generate (default 32), refused above the server's limit or the model's positions."""
    limit = request.app.state.limits.max_new_tokens_limit
    new = min(DEFAULT_NEW_TOKENS, limit) if new is None else new
    if new > limit:
        raise ApiError(400, f"{param}: {new} is above this server's limit of {limit}", param)
    positions = worker.info.max_positions
    if positions is not None and spec(worker.info.kind).needs_positions(len(prompt), new) > positions:
        raise ApiError(400, f"{where}: the prompt's {len(prompt)} tokens plus {param}={new} exceed the model's "
                            f"{positions} positions", where)
    return new


async def forced_bos(request: Request, worker: Worker, body: Sampling | CompletionRequest,
                     prefix: str = "") -> int | None:
    """A request's forced first token: its forced_bos_token_id, within the vocabulary, or its target_language
    resolved through the model's tokenizer (on the tokenizer thread); None: the model's own. `prefix` is
    where the fields are (a v2 request's `parameters.`)."""
    forced, vocab = body.forced_bos_token_id, worker.info.vocab_size
    if forced is not None and not 0 <= forced < vocab:
        raise ApiError(400, f"{prefix}forced_bos_token_id: token id {forced} is outside the vocabulary [0, {vocab})",
                       f"{prefix}forced_bos_token_id")
    if body.target_language is None:
        return forced
    pool: Executor = request.app.state.tokenizers[worker.info.name]
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, worker.forced_bos, body.target_language, forced)
    except HotrodError as exc:  # its message begins with the field's name
        raise ApiError(400, f"{prefix}{first_line(exc)}", f"{prefix}target_language") from None


def prompt_lookup(worker: Worker, speculate: Speculate | None, num_beams: int, param: str = "speculate") -> int | None:
    """A request's own prompt-lookup draft length (None: the server's default applies), refused where
    speculation cannot run: with beams, or on a model whose backend cannot verify drafts."""
    if speculate is None:
        return None
    refusal = draft_rules.refusal(num_beams, worker.info.verifies_drafts)
    if speculate.prompt_lookup and refusal:
        said = (f"prompt lookup {refusal} (num_beams={num_beams})" if refusal == draft_rules.BEAMS
                else f"model '{worker.info.name}' cannot speculate: {refusal}")
        raise ApiError(400, f"{param}: {said}", param)
    return speculate.prompt_lookup
