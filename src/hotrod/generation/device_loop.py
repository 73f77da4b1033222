"""Greedy and sampled decoding with the chosen tokens kept on the device that made the logits.

On a GPU, reading a chosen token on the host (`.cpu()`, `.tolist()`, `.item()`) waits until the device's
queue has drained: a loop that reads every step's token leaves the GPU idle while the host prepares the
next step, and the host idle while the GPU runs it, so a small model's step costs the sum of both. Here
the tokens, which rows have finished and the sequences so far stay on the device, and the host enqueues
step after step, asking whether every row has finished only once every `READ_EVERY` steps. What a step
feeds besides its tokens (each row's length and position) the host knows without asking: every row
advances by one a step.

The output is the host loop's (`hotrod.generation.search.sample_or_greedy`) to the token: the same
processors over the same rows, the same draws from the same generator in the same order, finished rows
fed the pad token. The steps that ran after the last row's EOS, before the host looked, are cut from it
(at most READ_EVERY - 1 steps of device time, once a generation).
"""

from __future__ import annotations

import torch

from hotrod.generation.config import Settings
from hotrod.generation.sampling import argmax, greedy_only, held_back, index_on, process
from hotrod.generation.state import DecodingState

# Steps between the host's looks at whether every row has finished: each look waits for the device to
# drain its queue; each step past the last EOS before a look is wasted device time.
READ_EVERY = 8


def applies(logits: torch.Tensor) -> bool:
    """Whether a generation whose first logits are `logits` decodes here: where they live off the host
    (on the CPU the host loop's numpy path is faster, and its reads cost nothing)."""
    return logits.device.type != "cpu"


def decode(state: DecodingState, sequences: torch.Tensor, logits: torch.Tensor, s: Settings,
           skip: torch.Tensor | None) -> torch.Tensor:
    """Decode from a started `state` (its initial `sequences` and first `logits`) until every row has
    emitted an EOS or reached `max_length`; `skip` is each row's leading padding (the repetition penalty's).
    Returns the sequences on the CPU, as the host loop does."""
    device = logits.device
    start = sequences.shape[1]
    rows = torch.empty((sequences.shape[0], max(s.max_length, start + 1)), dtype=torch.long, device=device)
    rows[:, :start] = sequences.to(device)
    skip = None if skip is None else skip.to(device)
    eos = index_on(tuple(s.eos_token_ids), device) if s.eos_token_ids else None
    unfinished = torch.ones(sequences.shape[0], dtype=torch.bool, device=device)
    length, unread = start, 0
    while True:
        tokens = choose(logits, rows[:, :length], s, skip)
        if eos is not None:  # a finished row is fed the pad token (which the settings make EOS's when unset)
            tokens = torch.where(unfinished, tokens, s.pad_token_id)
            unfinished &= ~torch.isin(tokens, eos)
        rows[:, length] = tokens
        length, unread = length + 1, unread + 1
        if length >= s.max_length:
            break
        if eos is not None and unread >= READ_EVERY:
            unread = 0
            if all_finished(unfinished):
                break
        logits = state.step(tokens)
    out = rows[:, :length].cpu()
    return out if eos is None else out[:, :ended(out, start, eos.cpu())]


def all_finished(unfinished: torch.Tensor) -> bool:
    """Whether no row is left: the host's one wait on the device in READ_EVERY steps."""
    return not bool(unfinished.any())


def choose(logits: torch.Tensor, rows: torch.Tensor, s: Settings, skip: torch.Tensor | None) -> torch.Tensor:
    """Each row's next token, left where the logits are: `hotrod.generation.search.pick` without its copy to
    the host. Greedy settings whose processors only hold fixed ids back process the scores only at the steps
    where they hold some back (the ids depend on the row's length alone, which the host knows)."""
    if greedy_only(s) and held_back(s, rows.shape[1]) == ():
        return argmax(logits)
    scores = process(logits, rows, s, skip)
    if s.do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    return argmax(scores)


def ended(out: torch.Tensor, start: int, eos: torch.Tensor) -> int:
    """The host loop's output length: just past the step where the last row emitted its first EOS (every
    row decodes from `start` unfinished), or all of `out` where some row never did."""
    hits = torch.isin(out[:, start:], eos)
    if not bool(hits.any(dim=1).all()):
        return out.shape[1]
    return start + int(hits.int().argmax(dim=1).max()) + 1
