"""Text a request may hold that is not Unicode: a lone UTF-16 surrogate.

JSON lets a string escape any code unit (`"\\ud800"`), so a valid JSON body can carry half a surrogate pair,
which Python decodes into a `str` that no UTF-8 encoder (a tokenizer's, a response's) will take: the request
would fail deep inside, as a 500, or its refusal would, where the message repeats the text. Such bodies are
refused at the door instead (`hotrod.serve.gate`, and the v2 binary form's JSON header in
`hotrod.serve.tensors`); messages are made safe to encode as well, for any text that reaches one otherwise.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A \u escape of a surrogate code unit, paired or not: a body without one cannot decode to a lone surrogate
# (raw surrogate bytes are not UTF-8, and JSON decoding refuses them), so only such bodies are parsed here.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogate(raw: bytes, parsed: Any = None) -> str | None:
    """Where in the JSON body `raw` a string holds a lone surrogate (a path such as `input[1]`), or None where
    none does, or where the body is not JSON at all (its parser's refusal is the one to give). `parsed`: the
    body already parsed, where the caller has it."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return None
    if parsed is None:
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError):
            return None
    return _find(parsed)


def _find(value: Any) -> str | None:
    """The path of the first string (key or value, in the body's order) holding a surrogate; iterative, for
    any depth. Each entry is (path, value, key, where the key is): a dict's key is checked as its entry comes up."""
    pending: list[tuple[str, Any, Any, str]] = [("body", value, None, "")]
    while pending:
        path, item, key, parent = pending.pop()
        if key is not None and not _encodable(key):
            return f"{parent} (a key)"
        if isinstance(item, str) and not _encodable(item):
            return path
        if isinstance(item, dict):
            pending.extend((_child(path, str(k)), child, k, path) for k, child in reversed(item.items()))
        elif isinstance(item, list):
            pending.extend((f"{path}[{i}]", child, None, path) for i, child in reversed(list(enumerate(item))))
    return None


def _child(path: str, key: str) -> str:
    return key if path == "body" else f"{path}.{key}"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def safe(text: str) -> str:
    """`text` as it can be sent: a lone surrogate written as its escape (`\\ud800`), everything else as is."""
    return text if _encodable(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def refusal(where: str) -> str:
    """The one-line refusal of a body whose string at `where` holds a lone surrogate."""
    return (f"{safe(where)}: the text holds a lone UTF-16 surrogate (half of a \\uXXXX pair), which is not "
            "Unicode; send the pair whole, or UTF-8")
