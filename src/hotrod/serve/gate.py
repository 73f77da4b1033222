"""The door of every /v1, /v2 and TEI request: its key, its media type and its size, before any of it is parsed.

An ASGI middleware rather than FastAPI dependencies, because FastAPI reads and parses a body before it
runs any dependency: an unauthenticated or oversized request would already have cost its parse (and
answered 400/422 instead of 401/413). Probes (/health, /ready, /metrics, /v2/health/*) pass untouched.

Only `application/json` bodies are read: a browser sends a cross-site `text/plain` or form POST without
asking the server first (no CORS preflight), so accepting those would let any web page run requests on
a server bound to localhost. The v2 infer route also reads the two bodies Triton's client sends with no
Content-Type at all, neither of which a web page can send unasked: the binary tensor form, whose
`Inference-Header-Content-Length` header a browser must ask leave for (a CORS preflight, which this
server grants only to the origins it is told to), and plain JSON from a client that is not a browser
(browsers put an `Origin` header on every POST).
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hotrod.serve import unicode_text
from hotrod.serve.http_errors import INFER_PATH, TEI_ROUTES, error_response, is_v2, record
from hotrod.serve.tensors import HEADER

API_PREFIX = "/v1/"
OPEN_V2 = "/v2/health/"


def guarded(path: str) -> bool:
    """The routes behind the door: every /v1 and /v2 route but the v2 health probes, and TEI's."""
    return path.startswith(API_PREFIX) or path in TEI_ROUTES or (is_v2(path) and not path.startswith(OPEN_V2))


def _readable(path: str, media: str, headers: Headers) -> bool:
    """JSON anywhere; on the v2 infer route, also what tritonclient sends and no web page can (see above)."""
    if media == "application/json":
        return True
    if INFER_PATH.fullmatch(path) is None:
        return False
    return HEADER in headers or (not media and "origin" not in headers)


class Gate:
    def __init__(self, app: ASGIApp, api_key: str | None, max_bytes: int):
        self.app = app
        self.api_key = api_key
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        send = _tagged(send, request_id)
        if guarded(scope["path"]):
            refusal, receive = await self._check(scope, receive)
            if refusal is not None:
                await _refuse(scope, receive, send, *refusal)
                return
        await self.app(scope, receive, send)

    async def _check(self, scope: Scope, receive: Receive) -> tuple[tuple[Any, ...] | None, Receive]:
        """(status, message, headers) of a refusal, or None and a `receive` that replays the read body."""
        headers = Headers(scope=scope)
        if self.api_key is not None and not self._authorized(headers.get("authorization", "")):
            return (401, "a valid API key is required: send `Authorization: Bearer <key>`",
                    {"WWW-Authenticate": "Bearer"}), receive
        if scope["method"] != "POST":
            return None, receive
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if not _readable(scope["path"], media, headers):
            return (415, f"the body must be JSON, sent with `Content-Type: application/json` (got "
                         f"{media or 'none'})", None), receive
        if headers.get("content-encoding", "identity").strip().lower() != "identity":  # read as JSON, it would fail
            return (415, "compressed request bodies are not supported; send the body uncompressed", None), receive
        declared = headers.get("content-length", "")
        # ASCII digits only (str.isdigit takes "²", which int() refuses); more than 20 is past any limit
        if declared.isascii() and declared.isdigit() and (len(declared) > 20 or int(declared) > self.max_bytes):
            return self._too_large(), receive
        body = await _read(receive, self.max_bytes)
        if body is None:
            return self._too_large(), receive
        binary = HEADER in headers and INFER_PATH.fullmatch(scope["path"]) is not None  # its header: in tensors
        where = None if binary else unicode_text.lone_surrogate(body)
        if where is not None:
            return (400, unicode_text.refusal(where), None), _replay(body, receive)
        return None, _replay(body, receive)

    def _authorized(self, header: str) -> bool:
        scheme, _, key = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(key.strip().encode(), self.api_key.encode())

    def _too_large(self) -> tuple[Any, ...]:
        return 413, f"the body is larger than this server's limit of {self.max_bytes} bytes", None


async def _read(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes `limit` bytes (the rest is never read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body read at the door, then the connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


def _tagged(send: Send, request_id: str) -> Send:
    """Every response carries its request's id, the one the log and any 500 name."""
    async def tagged(message: Message) -> None:
        if message["type"] == "http.response.start":
            MutableHeaders(scope=message)["X-Request-ID"] = request_id
        await send(message)

    return tagged


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, message: str,
                  headers: dict[str, str] | None) -> None:
    record(Request(scope, receive), status)
    await error_response(status, message, None, headers, path=scope["path"])(scope, receive, send)
