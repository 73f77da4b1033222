"""One exception type for every mistake a user can make.

It subclasses ValueError so that API callers can catch the usual type, and the CLI turns it into one
line (`hotrod: error: ...`) and a non-zero exit instead of a traceback.
"""


class HotrodError(ValueError):
    """A user-facing error: bad input, unsupported model, unreadable or incompatible artifact."""
