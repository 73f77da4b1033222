"""Reading a ticket's events under a deadline while watching the client, and streaming them as SSE.

A request holds a slot in a model's batch until its ticket ends, so the app must let go of it as soon as
nobody wants the answer: when the deadline passes, when the client disconnects (seen by polling between
and during events), and when the response is torn down for any other reason (the `finally` paths here).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from hotrod import kinds
from hotrod.serve.http_errors import (
    CLIENT_CLOSED,
    ApiError,
    Recorder,
    error_body,
    log,
    outcome_of,
    request_id_of,
    worker_error,
)
from hotrod.serve.messages import Event, Ticket

POLL_S = 0.05  # how often a waiting request asks whether its client is still there


def submit(request: Request, submit: Callable[[], Ticket]) -> TicketReader:
    """The ticket of a submitted request, read under the server's timeout (or the request's own, where lower:
    `request.state.timeout_s`); a refusal is its 4xx/5xx."""
    try:
        ticket = submit()
    except Exception as exc:  # QueueFull 429, ShuttingDown/WorkerDown 503, HotrodError 400, anything else 500
        raise worker_error(exc, request_id_of(request)) from None
    limit = request.app.state.limits.request_timeout_s
    return TicketReader(ticket, request, min(limit, getattr(request.state, "timeout_s", limit)))


def submit_all(request: Request, calls: list[Callable[[], Ticket]]) -> list[TicketReader]:
    """One reader per call, submitted together; if one is refused (a full queue), those taken are let go."""
    readers: list[TicketReader] = []
    try:
        for call in calls:
            readers.append(submit(request, call))
    except BaseException:
        for reader in readers:
            reader.close()
        raise
    return readers


class TicketReader:
    """Yields a ticket's events one by one; raises ApiError 504 at the deadline, 499 when the client left.

    Either way, and in `close()` when the final event was never read, the ticket is cancelled so that the
    worker frees its slot at the next step.
    """

    def __init__(self, ticket: Ticket, request: Request, timeout_s: float, poll_s: float = POLL_S):
        self.ticket = ticket
        self.request = request
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + timeout_s
        self.finished = False
        self._events = ticket.events()
        self._pending: asyncio.Future[Event] | None = None
        self._polled = self.loop.time()
        self.request_id = request_id_of(request)

    async def next(self) -> Event:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._events.__anext__())
        while True:
            now = self.loop.time()
            if now >= self.deadline:
                self.close()
                raise ApiError(504, f"the request did not finish within {self.timeout_s:g} s")
            # Poll the client even while events keep arriving, or a fast stream would never notice.
            if now - self._polled >= self.poll_s:
                self._polled = now
                if await self.request.is_disconnected():
                    self.close()
                    raise ApiError(CLIENT_CLOSED, "the client closed the connection")
            done, _ = await asyncio.wait({self._pending}, timeout=min(self.poll_s, self.deadline - now))
            if done:
                event = self._pending.result()
                self._pending = None
                self.finished = event.finish_reason is not None or event.error is not None
                return event

    def close(self) -> None:
        """Let go of the ticket: cancel it unless its final event was read."""
        if not self.finished:
            self.finished = True
            self.ticket.cancel()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


class Detokenizer:
    """Text pieces of a growing list of ids whose concatenation is the text of the whole list.

    Decoding ids one at a time is wrong for byte-level BPE (a character split over two tokens) and for
    SentencePiece (a token's leading space is dropped when decoded alone), so each piece is the difference
    between the decoding of a short window and of the same window plus the new ids, held back while it ends
    in an incomplete character.
    """

    def __init__(self, decode: Callable[[list[int]], str], context: Sequence[int] = ()):
        """`context`: ids the text continues (a decoder's prompt, `prompt_context`), whose own text is not
        given: the first piece is read after them, as the whole sequence's decoding reads it."""
        self.decode = decode
        self.ids: list[int] = list(context)
        self.prefix = 0  # the window's start: context for the next piece
        self.read = len(self.ids)  # ids already turned into text

    def add(self, tokens: list[int]) -> str:
        self.ids.extend(tokens)
        return self._piece(final=False)

    def peek(self, tokens: list[int]) -> list[str]:
        """The text each of `tokens` would add after the ids so far, in their context, without adding it:
        alternative tokens' strings as the chosen one's is made."""
        before = len(self.decode(self.ids[self.prefix:self.read]))  # held-back ids' text is the next piece's
        return [self.decode(self.ids[self.prefix:] + [token])[before:] for token in tokens]

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the very end)."""
        return self._piece(final=True)

    def _piece(self, final: bool) -> str:
        if self.read == len(self.ids):
            return ""
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]


CONTEXT_TOKENS = 6  # prompt ids a continuation is decoded after: a word's first token (its space) and a character's


def prompt_context(decode: Callable[[list[int]], str], kind: str, prompt: Sequence[int]) -> list[int]:
    """The end of `prompt` that a continuation's text is decoded after (`Detokenizer`), where the model's
    answer continues its prompt (a decoder): decoded alone, a SentencePiece word's first token loses its space
    ("hello world" + "▁world" read "hello worldworld"). None for an encoder-decoder, whose answer starts anew,
    or where the prompt ends inside a character (its text is not yet whole)."""
    if not kinds.spec(kind).continues_prompt:
        return []
    context = list(prompt[-CONTEXT_TOKENS:])
    return [] if decode(context).endswith("\ufffd") else context


def continuation(decode: Callable[[list[int]], str], context: Sequence[int], tokens: list[int]) -> str:
    """The whole text of `tokens` after `context` (`prompt_context`), as the pieces of a stream join into it."""
    detokenizer = Detokenizer(decode, context)
    return detokenizer.add(tokens) + detokenizer.flush()


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: `data: <json>` (or a literal such as [DONE]) and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class EventStream(StreamingResponse):
    """A text/event-stream response that runs `on_close` however it ends.

    Starlette cancels the streaming task when the client disconnects; a generator cancelled at a `yield`
    is not resumed, so its own `finally` might run only when it is garbage-collected. Closing it here, and
    calling `on_close`, lets go of the ticket at once.
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except (Exception, asyncio.CancelledError):  # closing is best effort; the ticket is let go
                    pass


_FINISH_OUTCOMES = {"cancelled": "cancelled", "timeout": "timeout"}
Chunk = Callable[[str, list[int], str | None, dict[str, int] | None], dict[str, Any]]


async def collect(reader: TicketReader) -> tuple[list[int], Event]:
    """All tokens of a ticket and its final event; a failed, cancelled or timed-out ticket is an ApiError."""
    tokens: list[int] = []
    try:
        while True:
            event = await reader.next()
            if event.error is not None:
                raise worker_error(event.error, reader.request_id)
            tokens.extend(event.tokens)
            if event.finish_reason is not None:
                break
    finally:
        reader.close()
    check_end(event)
    return tokens, event


async def collect_all(readers: list[TicketReader]) -> list[tuple[list[int], Event]]:
    """`collect` of every reader at once, in order; the first failure fails them all and lets every ticket go."""
    tasks = [asyncio.ensure_future(collect(reader)) for reader in readers]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for reader in readers:
            reader.close()


def check_end(event: Event) -> None:
    """Refuse an ending that is no answer: the worker cancelled the request, or it timed out there."""
    if event.finish_reason == "cancelled":
        raise ApiError(503, "the server cancelled the request")
    if event.finish_reason == "timeout":
        raise ApiError(504, "the model timed out on this request")


async def stream(reader: TicketReader, recorder: Recorder, decode: Callable[[list[int]], str],
                 prompt_tokens: int, chunk: Chunk, context: Sequence[int] = ()) -> EventStream:
    """An SSE response of a generation: `chunk(text, token_ids, finish_reason, usage)` shapes each event.

    The first event is awaited before the response starts, so that a request that fails or times out
    before its first token still gets a real status code; later failures become an error event. The text is
    read after `context` (`prompt_context`).
    """
    try:
        first = await reader.next()
        if first.error is not None:
            raise worker_error(first.error, reader.request_id)
    except BaseException:
        reader.close()
        raise
    detokenizer = Detokenizer(decode, context)

    async def events() -> AsyncIterator[str]:
        event, count = first, 0
        try:
            while event.error is None:
                count += len(event.tokens)
                piece = detokenizer.add(event.tokens)
                if event.finish_reason is not None:
                    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": count,
                             "total_tokens": prompt_tokens + count}
                    yield sse(chunk(piece + detokenizer.flush(), event.tokens, event.finish_reason, usage))
                    recorder.done(_FINISH_OUTCOMES.get(event.finish_reason, "ok"))
                    yield sse("[DONE]")
                    return
                yield sse(chunk(piece, event.tokens, None, None))
                event = await reader.next()
            raise worker_error(event.error, reader.request_id)
        except Exception as exc:  # noqa: BLE001  (a stream ends with an error event, never a dropped connection)
            for line in stream_failed(exc, recorder, reader.request_id):
                yield line

    def on_close() -> None:
        reader.close()
        recorder.done("cancelled")

    return EventStream(events(), on_close)


def stream_failed(exc: Exception, recorder: Recorder, request_id: str) -> list[str]:
    """The last events of a stream that fails after it started: its error (unless the client left), [DONE].

    An ApiError says what happened; anything else is a bug here, logged under the request's id.
    """
    if not isinstance(exc, ApiError):
        log.error("request %s: streaming failed: %r", request_id, exc, exc_info=exc)
        exc = ApiError(500, f"internal server error (request id {request_id})")
    recorder.done(outcome_of(exc.status))
    if exc.status == CLIENT_CLOSED:
        return []
    return [sse(error_body(exc.status, exc.message)), sse("[DONE]")]
