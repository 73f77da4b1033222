"""One completion choice as its tokens arrive: its text, cut at the first stop string, and its logprobs.

Stop strings are matched on text, not tokens (a stop string may span tokens, or end inside one), so the
text is held back while its end could still become a stop string; what is sent is never taken back.
The text comes from the streaming `Detokenizer` (sse.py) rather than tokenizers' `DecodeStream`: it
works through the `Worker.decode` protocol, so it serves tokenizer-less and fake workers alike, and it
drops special tokens exactly as the whole-text decode does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hotrod.serve.messages import TokenLogprobs
from hotrod.serve.sse import Detokenizer


@dataclass
class Logprobs:
    """OpenAI's legacy `logprobs` object, built token by token."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}


class Choice:
    """The text of one choice, piece by piece (`add`, then `flush`), ended early by a stop string."""

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str], logprobs: int | None, start: int = 0,
                 context: Sequence[int] = ()):
        """`start`: the echoed prompt's length (offsets count it); `context`: the prompt ids the text continues
        (`sse.prompt_context`)."""
        self.decode = decode
        self.stops = stops
        self.detokenizer = Detokenizer(decode, context)
        self.held = ""  # text that may be the start of a stop string
        self.sent = start  # characters of text handed out (the echoed prompt counts: offsets start after it)
        self.tokens = 0  # tokens whose text is (at least partly) in the choice
        self.stopped = False
        self.logprobs = None if logprobs is None else Logprobs(top_logprobs=[] if logprobs else None)
        self._offset = start  # where the next token's text starts, for text_offset
        self._handed = 0  # logprobs entries handed out so far

    def add(self, tokens: list[int], logprobs: list[TokenLogprobs] | None = None) -> tuple[str, Logprobs | None]:
        """The new text that is safe to send, and the logprobs of the tokens it took in.

        Each token's string (and offset) is the text it added in context, so they join into the text
        exactly; a token that ends inside a character gets "" and the next one the whole character.
        """
        if self.stopped:
            return "", None
        self.tokens += len(tokens)
        text = ""
        for i, token in enumerate(tokens):
            noted = self.logprobs is not None and logprobs
            top = self._alternatives(token, logprobs[i]) if noted and self.logprobs.top_logprobs is not None else None
            piece = self.detokenizer.add([token])
            if noted:
                self._note(self.logprobs, piece, logprobs[i], top)
            text += piece
        text = self._release(self.held + text, final=False)
        return text, self._due(final=self.stopped)

    def flush(self) -> tuple[str, Logprobs | None]:
        """Whatever is still held at the end (no stop string came), and the logprobs not yet handed out."""
        text = "" if self.stopped else self._release(self.held + self.detokenizer.flush(), final=True)
        return text, self._due(final=True)

    def _due(self, final: bool) -> Logprobs | None:
        """Logprobs of the tokens whose text has been handed out (all that are left, at the end) and whose
        logprobs have not: a token held back as the possible start of a stop string waits with its text."""
        if self.logprobs is None:
            return None
        offsets = self.logprobs.text_offset
        end = len(offsets) if final else sum(1 for offset in offsets if offset < self.sent)
        start, self._handed = self._handed, max(self._handed, end)
        if end <= start:
            return None
        top = self.logprobs.top_logprobs
        return Logprobs(self.logprobs.tokens[start:end], self.logprobs.token_logprobs[start:end],
                        None if top is None else top[start:end], offsets[start:end])

    def _release(self, text: str, final: bool) -> str:
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.held = True, ""
            self._trim(self.sent + cut)
            return self._send(text[:cut])
        keep = 0 if final else _held_back(text, self.stops)
        self.held = text[len(text) - keep:]
        return self._send(text[: len(text) - keep])

    def _send(self, text: str) -> str:
        self.sent += len(text)
        return text

    def _alternatives(self, token: int, entry: TokenLogprobs) -> list[tuple[str | None, float]]:
        """The step's most likely tokens, each by the text it would add in this context (as the chosen token's
        string is made), read before the chosen one goes in; the chosen one's text (None here) is its piece."""
        texts = iter(self.detokenizer.peek([alternative for alternative, _ in entry.top if alternative != token]))
        return [(None if alternative == token else next(texts), logprob) for alternative, logprob in entry.top]

    def _note(self, into: Logprobs, piece: str, entry: TokenLogprobs,
              top: list[tuple[str | None, float]] | None) -> None:
        into.tokens.append(piece)
        into.token_logprobs.append(entry.logprob)
        into.text_offset.append(self._offset)
        if into.top_logprobs is not None and top is not None:
            alternatives: dict[str, float] = {}
            for text, logprob in top:  # two that read alike keep the likelier's logprob: the format keys by text
                alternatives.setdefault(piece if text is None else text, logprob)
            into.top_logprobs.append(alternatives)
        self._offset += len(piece)

    def _trim(self, end: int) -> None:
        """After a stop string: keep only the tokens whose text starts before it (OpenAI's usage counts)."""
        if self.logprobs is not None:
            kept = sum(1 for offset in self.logprobs.text_offset if offset < end)
            for name in ("tokens", "token_logprobs", "text_offset"):
                del getattr(self.logprobs, name)[kept:]
            if self.logprobs.top_logprobs is not None:
                del self.logprobs.top_logprobs[kept:]


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest end of `text` that some stop string starts with."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - size:]):
                longest = size
                break
    return longest
