"""What the server allows any request, and who may call it: the options checked at the door.

Every limit is checked before a request costs anything: its bytes before it is parsed, its text's
length before it is tokenized, its tokens and inputs before it takes a slot. A model's own limits
(vocabulary, positions) come from its ModelInfo; these are the server's.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotrod.errors import HotrodError, check_count, check_number

# Families with relative positions (T5) have no position table to bound a prompt, but their encoder is
# quadratic in it: without a limit one long text would hold every other request back.
RELATIVE_POSITIONS_DEFAULT = 512
# A token is rarely longer than this many bytes of text, so a text past tokens x this is refused untokenized.
BYTES_PER_TOKEN = 32
# Where an API key may come from instead of a flag or a config file, which others can read.
API_KEY_ENV = "HOTROD_API_KEY"


@dataclass(frozen=True)
class ServeLimits:
    """Per-request limits (`max_input_tokens=None`: each model's positions, or 512 where they are relative)."""

    max_new_tokens_limit: int = 256
    request_timeout_s: float = 60.0
    max_input_tokens: int | None = None
    max_batch_inputs: int = 256
    max_request_bytes: int = 4 * 2**20
    max_connections: int = 1024
    shutdown_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_new_tokens_limit < 1:
            raise HotrodError(f"max_new_tokens_limit must be at least 1, not {self.max_new_tokens_limit}")
        if not self.request_timeout_s > 0:
            raise HotrodError(f"request_timeout_s must be positive, not {self.request_timeout_s}")
        check_number("request_timeout_s", self.request_timeout_s)
        check_number("shutdown_timeout_s", self.shutdown_timeout_s, 0)
        for name in ("max_batch_inputs", "max_request_bytes", "max_connections"):
            check_count(name, getattr(self, name))
        if self.max_input_tokens is not None:
            check_count("max_input_tokens", self.max_input_tokens)

    def input_tokens(self, max_positions: int | None) -> int:
        """The longest prompt (or embedding input) a model with `max_positions` is sent."""
        if self.max_input_tokens is not None:
            return self.max_input_tokens if max_positions is None else min(self.max_input_tokens, max_positions)
        return RELATIVE_POSITIONS_DEFAULT if max_positions is None else max_positions


@dataclass(frozen=True)
class Access:
    """Who may call the server: an API key for every /v1 and /v2 route (not the probes), the origins a browser
    may call from, /docs."""

    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    docs: bool = False

    def __post_init__(self) -> None:
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            raise HotrodError("api_key must be a non-empty string without spaces")
        if any(not origin for origin in self.cors_origins):
            raise HotrodError("a CORS origin must not be empty")
