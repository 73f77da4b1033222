"""OpenAI's completions endpoint: `n` choices of a prompt (or of each of a list), with `stop`, `logprobs`, `echo`, `seed` and
streaming (`stream_options.include_usage` adds a last chunk with the usage, as OpenAI's API does).

Each choice is a request of its own to the worker (choice i of a seeded request samples with seed + i,
so a request is repeatable and its choices differ); a stop string ends its choice and frees its slot.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response

from hotrod.serve.checks import forced_bos, new_tokens, prompt_lookup, token_rows
from hotrod.serve.choices import Choice, Logprobs
from hotrod.serve.endpoints import GENERATORS, STREAMED, json_response, sampling, usage
from hotrod.serve.http_errors import (
    ApiError,
    Recorder,
    request_id_of,
    resolve,
    worker_error,
)
from hotrod.serve.messages import Params, Worker
from hotrod.serve.schemas import MAX_STOPS, CompletionChoice, CompletionRequest, CompletionResponse, StreamOptions
from hotrod.serve.sse import EventStream, TicketReader, check_end, prompt_context, sse, stream_failed, submit_all

router = APIRouter()
Piece = tuple[str, Logprobs | None, str | None]  # text, its tokens' logprobs, finish reason


@router.post("/v1/completions", response_model=CompletionResponse, responses=STREAMED)
async def completions(body: CompletionRequest, request: Request) -> Response:
    """OpenAI's completions endpoint (legacy): `n` choices of a prompt, text or token ids, or of each of a list."""
    worker, recorder = resolve(request, "completions", body.model, GENERATORS)
    check_neutral(body)
    stops = _stops(body.stop)
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options: only allowed with stream: true", "stream_options")
    if body.echo and body.logprobs is not None:
        raise ApiError(400, "echo: not supported together with logprobs (the prompt is not scored)", "echo")
    forced = await forced_bos(request, worker, body)
    items = _prompts(request, body)
    wheres = ["prompt" if len(items) == 1 else f"prompt[{i}]" for i in range(len(items))]
    prompts = await token_rows(request, worker, items, "prompt", wheres)
    news = [new_tokens(request, worker, prompt, body.max_tokens, where, "max_tokens")
            for prompt, where in zip(prompts, wheres)]
    lookup = prompt_lookup(worker, body.speculate, num_beams=1)
    readers = _submit_all(request, worker, prompts, body, news, lookup, forced)
    echoes = [(item if isinstance(item, str) else worker.decode(prompt)) if body.echo else ""
              for item, prompt in zip(items, prompts) for _ in range(body.n)]  # choice i is of prompt i // n
    contexts = [prompt_context(worker.decode, worker.info.kind, prompt) for prompt in prompts]
    choices = [Choice(worker.decode, stops, body.logprobs, len(echo), contexts[i // body.n])
               for i, echo in enumerate(echoes)]
    pieces = [_pieces(reader, choice) for reader, choice in zip(readers, choices)]
    head = {"id": f"cmpl-{request_id_of(request)}", "object": "text_completion", "created": int(time.time()),
            "model": recorder.model}
    prompt_tokens = sum(map(len, prompts))
    if body.stream:
        options = body.stream_options or StreamOptions()
        return await _stream(readers, pieces, choices, recorder, head, echoes, prompt_tokens, options)
    try:
        texts = await asyncio.gather(*(_whole(p) for p in pieces))
    finally:
        for reader in readers:
            reader.close()
    answers = [CompletionChoice(text=echo + text, index=i, finish_reason=finish,
                                logprobs=c.logprobs.as_dict() if c.logprobs is not None else None)
               for i, ((text, finish), c, echo) in enumerate(zip(texts, choices, echoes))]
    return json_response(CompletionResponse(**head, choices=answers,
                                            usage=usage(prompt_tokens, sum(c.tokens for c in choices))), recorder)


def _prompts(request: Request, body: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts, as OpenAI reads `prompt`: a text, token ids, or a list of either (a batch, whose
    prompt i has choices i * n .. i * n + n - 1); every choice is a request of its own, so a list of prompts
    makes at most the server's --max-batch-inputs of them."""
    prompt = body.prompt
    items = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt)
    if not items:
        raise ApiError(400, "prompt: the list is empty", "prompt")
    limit = request.app.state.limits.max_batch_inputs
    if len(items) > 1 and len(items) * body.n > limit:  # one prompt's n is bounded by the schema alone
        raise ApiError(400, f"prompt: {len(items)} prompts of n={body.n} choices make {len(items) * body.n}; this "
                            f"server takes at most {limit} per request (--max-batch-inputs)", "prompt")
    return items  # type: ignore[return-value]


def check_neutral(body: CompletionRequest) -> None:
    """OpenAI's fields hotrod does not run, at the values that change nothing (left out, or as clients send
    them on every call: penalties 0, no bias, no suffix, best_of = n); any other value is a 400 naming it."""
    neutral = {"best_of": (None, body.n), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
               "logit_bias": (None, {}), "suffix": (None, "")}
    for name, allowed in neutral.items():
        value = getattr(body, name)
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed if a is not None)
            raise ApiError(400, f"{name}: {value!r} is not supported; hotrod takes only {shown} (or leave it out)",
                           name)


def _stops(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    stops = [s for s in stops if s]  # "" and [] mean no stop strings
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop: at most {MAX_STOPS} stop strings, got {len(stops)}", "stop")
    return stops


def _submit_all(request: Request, worker: Worker, prompts: list[list[int]], body: CompletionRequest,
                news: list[int], lookup: int | None, forced: int | None) -> list[TicketReader]:
    """One ticket per choice of each prompt (a seeded prompt's choice i samples with seed + i, so that each
    prompt of a batch answers as it would alone)."""
    calls = []
    for prompt, new in zip(prompts, news):
        for i in range(body.n):
            params = Params(max_new_tokens=new, top_p=1.0 if body.top_p is None else body.top_p,
                            seed=None if body.seed is None else body.seed + i, logprobs=body.logprobs,
                            prompt_lookup=lookup, forced_bos_token_id=forced,
                            no_repeat_ngram_size=body.no_repeat_ngram_size, **sampling(body.temperature, True))
            calls.append(functools.partial(worker.submit_generate, prompt, params))
    return submit_all(request, calls)


async def _pieces(reader: TicketReader, choice: Choice) -> AsyncIterator[Piece]:
    """A choice's pieces as its events arrive, up to its stop string or its end; errors as ApiError."""
    try:
        while True:
            event = await reader.next()
            if event.error is not None:
                raise worker_error(event.error, reader.request_id)
            check_end(event)
            text, logprobs = choice.add(event.tokens, event.logprobs)
            if choice.stopped:
                yield text, logprobs, "stop"
                return
            if event.finish_reason is not None:
                rest, more = choice.flush()
                yield text + rest, _joined(logprobs, more), event.finish_reason
                return
            if text or logprobs is not None:
                yield text, logprobs, None
    finally:
        reader.close()  # a stop string ends the choice early: its slot is freed at the next step


def _joined(first: Logprobs | None, second: Logprobs | None) -> Logprobs | None:
    if first is None or second is None:
        return first or second
    top = None if first.top_logprobs is None else first.top_logprobs + (second.top_logprobs or [])
    return Logprobs(first.tokens + second.tokens, first.token_logprobs + second.token_logprobs, top,
                    first.text_offset + second.text_offset)


async def _whole(pieces: AsyncIterator[Piece]) -> tuple[str, str | None]:
    """A choice's whole text and finish reason."""
    collected = [piece async for piece in pieces]
    return "".join(text for text, _, _ in collected), collected[-1][2]


async def _stream(readers: list[TicketReader], pieces: list[AsyncIterator[Piece]], choices: list[Choice],
                  recorder: Recorder, head: dict[str, Any], echoes: list[str], prompt_tokens: int,
                  options: StreamOptions) -> EventStream:
    """Chunks of every choice as they come. The first piece of each is awaited before the response
    starts, so a request that fails before its first token still gets a real status code."""
    try:
        firsts = [await anext(p) for p in pieces]  # type: ignore[arg-type]
    except BaseException:
        for reader in readers:
            reader.close()
        raise

    def chunk(index: int, text: str, logprobs: Logprobs | None, finish: str | None) -> str:
        choice = {"text": text, "index": index, "finish_reason": finish,
                  "logprobs": logprobs.as_dict() if logprobs is not None else None}
        return sse({**head, "choices": [choice], **_obfuscation(options)})

    async def events() -> AsyncIterator[str]:
        try:
            for index, echo in enumerate(echoes):
                if echo:
                    yield chunk(index, echo, None, None)
            async for index, (text, logprobs, finish) in _merged(firsts, pieces):
                yield chunk(index, text, logprobs, finish)
            if options.include_usage:
                total = sum(c.tokens for c in choices)
                yield sse({**head, "choices": [], "usage": usage(prompt_tokens, total).model_dump(),
                           **_obfuscation(options)})
            recorder.done("ok")
            yield sse("[DONE]")
        except Exception as exc:  # noqa: BLE001  (a stream ends with an error event, never a dropped connection)
            for line in stream_failed(exc, recorder, readers[0].request_id):
                yield line

    def on_close() -> None:
        for reader in readers:
            reader.close()
        recorder.done("cancelled")

    return EventStream(events(), on_close)


async def _merged(firsts: list[Piece], pieces: list[AsyncIterator[Piece]]) -> AsyncIterator[tuple[int, Piece]]:
    """The pieces of every choice, in the order they arrive, each with its choice's index."""
    queue: asyncio.Queue[tuple[int, Piece | BaseException | None]] = asyncio.Queue()

    async def pump(index: int) -> None:
        try:
            queue.put_nowait((index, firsts[index]))
            if firsts[index][2] is None:
                async for piece in pieces[index]:
                    queue.put_nowait((index, piece))
        except Exception as exc:  # noqa: BLE001  (handed to the stream, which ends with it)
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i)) for i in range(len(pieces))]
    try:
        remaining = len(pieces)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


def _obfuscation(options: StreamOptions) -> dict[str, str]:
    """OpenAI's stream obfuscation: random characters of random length in each chunk, asked for by
    `stream_options.include_obfuscation`, so that a chunk's size on the wire does not give its text away."""
    return {"obfuscation": secrets.token_urlsafe(1 + secrets.randbelow(16))} if options.include_obfuscation else {}
