"""The request loop every peer worker runs: stdlib only, so a worker in another environment can use it.

Requests: `build` (make the peer: convert once, load), `call` (run the whole case, or one new token),
`close`. A reply is `{"ok": True, ...}` or `{"ok": False, "error": "<Type>: <first line>"}`. Anything the
libraries print goes to stderr, so stdout carries replies only.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable


def serve(build: Callable[..., object]) -> None:
    """Answers requests on stdin until `close` or EOF; `build(**args)` returns an object with `call(first)`
    and `info()` (what the build reply adds)."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library's print must not be read as a reply
    requests = sys.stdin.buffer
    peer = None
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        if request["op"] == "close":
            return
        try:
            if request["op"] == "build":
                peer = build(**request["args"])
                reply = {"ok": True, **peer.info()}
            else:
                reply = {"ok": True, "value": peer.call(request["first"])}
        except Exception as exc:  # reported to the harness, which skips this system with the reason
            reply = {"ok": False, "error": f"{type(exc).__name__}: {first_line(exc)}"}
        pickle.dump(reply, replies)
        replies.flush()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
