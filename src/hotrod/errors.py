"""One exception type for every mistake a user can make.

It subclasses ValueError so that API callers can catch the usual type, and the CLI turns it into one
line (`hotrod: error: ...`) and a non-zero exit instead of a traceback.
"""


class HotrodError(ValueError):
    """A user-facing error: bad input, unsupported model, unreadable or incompatible artifact."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (or its type's name): how a foreign error is shown in one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
