"""One exception type for every mistake a user can make.

It subclasses ValueError so that API callers can catch the usual type, and the CLI turns it into one
line (`hotrod: error: ...`) and a non-zero exit instead of a traceback.
"""

import math


class HotrodError(ValueError):
    """A user-facing error: bad input, unsupported model, unreadable or incompatible artifact."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (or its type's name): how a foreign error is shown in one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_number(name: str, value: float, low: float | None = None, high: float | None = None,
                 *, above: bool = False) -> float:
    """`value` when it is a finite number in [low, high] (strictly above `low` with `above`), else one line.

    inf and nan pass naive comparisons (`not nan < 0`) and then fail far from where they came in, as an
    overflow in a timer or a NaN in a draw; every option from a user goes through here first.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HotrodError(f"{name} must be a finite number, got {value!r}")
    if low is not None and (value <= low if above else value < low):
        raise HotrodError(f"{name} must be {'>' if above else '>='} {low:g}, got {value:g}")
    if high is not None and value > high:
        raise HotrodError(f"{name} must be <= {high:g}, got {value:g}")
    return value


def check_bool(name: str, value: object) -> bool:
    """`value` when it is True or False, else one line: a string such as "no" would read as true."""
    if not isinstance(value, bool):
        raise HotrodError(f"{name} must be true or false, got {value!r}")
    return value


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """`value` when it is one of `choices`, else one line that lists them."""
    if value not in choices:
        raise HotrodError(f"unknown {name} {value!r}; choose from {', '.join(choices)}")
    return value


def check_count(name: str, value: int, low: int = 1) -> int:
    """`value` when it is an integer >= `low` (not a bool, not a float that happens to be whole)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise HotrodError(f"{name} must be an integer >= {low}, got {value!r}")
    return value
