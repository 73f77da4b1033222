"""Each row's next tokens in the running batch, chosen as its request would get them alone.

Token choice is the decoding loop's own (`hotrod.generation.search.pick`), row by row where requests
differ in settings; plain greedy rows share one argmax. Each row's token is chosen on its own, so a row
whose choice fails (its outcome is the exception) fails alone, never its batch-mates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hotrod.generation.config import Settings
from hotrod.generation.lookup import Drafter
from hotrod.generation.sampling import argmax, plain_argmax
from hotrod.generation.search import pick
from hotrod.serve.messages import TokenLogprobs
from hotrod.serve.scheduler import Request
from hotrod.serve.speculation import agreed


@dataclass(frozen=True)
class Pick:
    """A row's next token, with its logprobs when its request asked for them."""

    token: int
    logprobs: TokenLogprobs | None = None


Outcome = list[Pick] | BaseException  # a row's next tokens (one, or more when a draft was kept), or why it has none


class RowOptions:
    """What one request needs at each step: its settings and, when sampling, its own random stream."""

    def __init__(self, settings: Settings, seed: int | None, prompt_lookup: int = 0, prompt: int = 0):
        """`prompt`: the request's prompt tokens, which begin the row it drafts from (an encoder-decoder's
        source, which its decoder's own prompt, the start token, is not)."""
        self.settings = settings
        self.drafter = Drafter(prompt_lookup, prompt=prompt) if prompt_lookup else None
        self.generator = None
        if settings.do_sample:
            self.generator = torch.Generator()
            self.generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
        # Plain greedy rows need no score processing: the whole batch takes one argmax (`plain_argmax` at the
        # prompt's length holds at every later one).
        self.plain = plain_argmax(settings, settings.prompt_length)


def accept(logits: torch.Tensor, requests: list[Request], drafts: list[list[int]],
           history: Callable[[Request], list[int]]) -> list[Outcome]:
    """Each row's tokens from the logits after its last token and each drafted one [rows, k, vocab]:
    plain greedy rows by one argmax over every position, the others drawn position by position after the
    row's `history` (as the decoding loop would hold it). A row whose choice raises gets the exception,
    the others their tokens."""
    plain = [i for i, r in enumerate(requests) if r.options.plain]
    tokens: list[list[int] | BaseException] = [[] for _ in requests]
    if plain:
        chosen = logits if len(plain) == len(requests) else logits[plain]
        for i, row in zip(plain, argmax(chosen).tolist()):
            tokens[i] = agreed(drafts[i], row)
    for i, r in enumerate(requests):
        if not r.options.plain:
            tokens[i] = _drawn(logits[i], r, drafts[i], history(r))
    return [t if isinstance(t, BaseException)
            else [Pick(token, _logprobs(logits[i, j], token, r.params.logprobs)) for j, token in enumerate(t)]
            for i, (r, t) in enumerate(zip(requests, tokens))]


def _drawn(logits: torch.Tensor, request: Request, draft: list[int], history: list[int]) -> list[int] | BaseException:
    """A row's tokens chosen one position at a time, each given those before it, while they match
    its draft. A sampled choice that differs from the draft is the row's next token as it stands: it
    was drawn from the distribution plain sampling would draw from there, with one draw per token."""
    tokens: list[int] = []
    for j in range(len(draft) + 1):
        token = _pick_one(logits[j : j + 1], request, history + tokens)
        if isinstance(token, BaseException):
            return token
        tokens.append(token)
        if j == len(draft) or token != draft[j]:
            break
    return tokens


def _pick_one(logits: torch.Tensor, request: Request, history: list[int]) -> int | BaseException:
    try:
        sequence = torch.tensor([history])
        return int(pick(logits, sequence, request.options.settings, None, request.options.generator)[0])
    except Exception as exc:  # noqa: BLE001  (this row's failure is its own: the batch goes on)
        return exc


def _logprobs(logits: torch.Tensor, token: int, top: int | None) -> TokenLogprobs | None:
    """The model's own log-probabilities (raw logits, before temperature or filtering), as vLLM reports."""
    if top is None:
        return None
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    pairs = list(zip(best.indices.tolist(), best.values.tolist())) if best is not None else []
    return TokenLogprobs(float(logprobs[token]), pairs)
