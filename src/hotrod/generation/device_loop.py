"""Greedy and sampled decoding with the chosen tokens kept on the device that made the logits.

On a GPU, reading a chosen token on the host (`.cpu()`, `.tolist()`, `.item()`) waits until the device's
queue has drained: a loop that reads every step's token leaves the GPU idle while the host prepares the
next step, and the host idle while the GPU runs it, so a small model's step costs the sum of both. Here
the tokens, which rows have finished and the sequences so far stay on the device, and the host enqueues
step after step. What a step feeds besides its tokens (each row's length and position) the host knows
without asking: every row advances by one a step.

- The host looks whether every row has finished once every `READ_EVERY` steps, and then reads the answer
  of its look before (copied to the host as its steps ran): the device always has the steps since then
  queued while the host waits.
- Where no host decision lies between steps (greedy, with processors that act on fixed ids alone, no
  forced step: `chain_length`) and the backend chains steps (the static engine), up to READ_EVERY steps
  run as one call, recorded as one graph, each fed the choice of the one before (`ChainPick`): one launch
  instead of several.

The output is the host loop's (`hotrod.generation.search.sample_or_greedy`) to the token: the same
processors over the same rows, the same draws from the same generator in the same order, finished rows
given the pad token. The steps that ran after the last row's EOS, before the host saw it, are cut from it
(about two looks' worth of steps of device time, once a generation), and the generator is left as the
host loop leaves it. A chain feeds a finished row its own choice rather than the pad token: rows are
independent, and that row's later tokens are the pad token.
"""

from __future__ import annotations

import torch

from hotrod.generation.chain_pick import ChainPick
from hotrod.generation.config import Settings
from hotrod.generation.sampling import argmax, draw, greedy_only, held_at, held_back, index_on, process
from hotrod.generation.state import DecodingState

# Steps between the host's looks at whether every row has finished, and the longest chain of steps in one
# call: each look waits for the device (the look before's steps); each step past the last EOS is wasted.
READ_EVERY = 8


def applies(logits: torch.Tensor) -> bool:
    """Whether a generation whose first logits are `logits` decodes here: where they live off the host
    (on the CPU the host loop's numpy path is faster, and its reads cost nothing)."""
    return logits.device.type != "cpu"


def decode(state: DecodingState, sequences: torch.Tensor, logits: torch.Tensor, s: Settings,
           skip: torch.Tensor | None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Decode from a started `state` (its initial `sequences` and first `logits`) until every row has
    emitted an EOS or reached `max_length`; `skip` is each row's leading padding (the repetition penalty's),
    `generator` what samples draw from (else the device's default). Returns the sequences on the CPU, as the
    host loop does."""
    device, vocab = logits.device, logits.shape[-1]
    start = sequences.shape[1]
    rows = torch.empty((sequences.shape[0], max(s.max_length, start + 1)), dtype=torch.long, device=device)
    rows[:, :start] = sequences.to(device, non_blocking=True)
    skip = None if skip is None else skip.to(device)
    ends, draws = _Ends(s, sequences.shape[0], device), _Draws(s, device, generator)
    tokens = ends.settle(choose(logits, rows[:, :start], s, skip, generator)[:, None])
    rows[:, start:start + 1] = tokens
    draws.taken()
    length, unread, chains = start + 1, 1, True
    while length < s.max_length:
        if ends.eos is not None and unread >= READ_EVERY:
            unread = 0
            if ends.look():
                break
        steps = chain_length(s, length, READ_EVERY) if chains else 1
        last = tokens[:, -1].contiguous()  # a chain's column: a strided view, which a compiled graph guards on
        block = state.chain(last, steps, ChainPick(s, length, steps, vocab, device)) if steps > 1 else None
        chains = chains and (steps == 1 or block is not None)
        if block is None:
            logits = state.step(last)
            block, steps = choose(logits, rows[:, :length], s, skip, generator)[:, None], 1
            draws.taken()
        tokens = ends.settle(block)
        rows[:, length:length + steps] = tokens
        length, unread = length + steps, unread + steps
    out = rows[:, :length].cpu()
    if ends.eos is None:
        return out
    kept = ended(out, start, ends.eos.cpu())
    draws.keep(kept - start)
    return out[:, :kept].contiguous()


def chain_length(s: Settings, length: int, most: int) -> int:
    """How many greedy steps may run as one chain from rows of `length` tokens: a power of two up to `most`
    and to `max_length`, with no forced step among them (processors that hold fixed ids back are applied
    inside the chain, `ChainPick`); 1 where none may (sampling, or a processor that reads the rows)."""
    if not greedy_only(s):
        return 1
    steps = 1
    while 2 * steps <= min(most, s.max_length - length):
        steps *= 2
    while steps > 1 and any(held_at(s, at) is None for at in range(length, length + steps)):
        steps //= 2
    return steps


def choose(logits: torch.Tensor, rows: torch.Tensor, s: Settings, skip: torch.Tensor | None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Each row's next token, left where the logits are: `hotrod.generation.search.pick` without its copy to
    the host. Greedy settings whose processors only hold fixed ids back process the scores only at the steps
    where they hold some back (the ids depend on the row's length alone, which the host knows)."""
    if greedy_only(s) and held_back(s, rows.shape[1]) == ():
        return argmax(logits)
    scores = process(logits, rows, s, skip)
    if s.do_sample:
        return draw(scores, 1, generator).squeeze(1)
    return argmax(scores)


class _Ends:
    """Which rows have finished, on the device, and the host's looks at whether all have."""

    def __init__(self, s: Settings, rows: int, device: torch.device):
        self.eos = index_on(tuple(s.eos_token_ids), device) if s.eos_token_ids else None
        self.pad = s.pad_token_id  # the settings make it EOS's where unset
        self.unfinished = torch.ones(rows, dtype=torch.bool, device=device)
        self._asked: _Answer | None = None

    def settle(self, block: torch.Tensor) -> torch.Tensor:
        """Steps' chosen tokens [rows, steps] as the host loop keeps them: a row's tokens after its first EOS
        (or after it had finished before them) the pad token."""
        if self.eos is None:
            return block
        hits = (block[..., None] == self.eos).any(dim=-1)  # not `isin`, whose sorting path waits on the device
        after = (hits.cumsum(dim=1) - hits.int()) > 0  # past the block's first EOS in the row
        block = torch.where(after | ~self.unfinished[:, None], self.pad, block)
        self.unfinished &= ~hits.any(dim=1)
        return block

    def look(self) -> bool:
        """Whether every row had finished at the look before this one (False at the first): asks the device
        now, reads the answer of the last time."""
        answer, self._asked = self._asked, _Answer(self.unfinished)
        return answer is not None and answer.all_finished()


class _Answer:
    """Whether any row is left, copied to the host behind the steps queued so far; read once they ran."""

    def __init__(self, unfinished: torch.Tensor):
        left = unfinished.any()
        self.event = None
        if left.is_cuda:
            self.event = torch.cuda.Event()
            left = left.to("cpu", non_blocking=True)
            self.event.record()
        self.left = left

    def all_finished(self) -> bool:
        if self.event is not None:
            self.event.synchronize()  # the steps up to the look that asked, not those queued since
        return all_finished(self.left)


class _Draws:
    """The generator's state after each sampled step, so that a generation leaves it as the host loop does:
    drawn from as many times as tokens were kept, not as many as steps ran before the host saw the end (a
    CUDA generator's state is its seed and offset, on the host: no wait on the device)."""

    def __init__(self, s: Settings, device: torch.device, generator: torch.Generator | None):
        self.generator = (generator or _default_generator(device)) if s.do_sample else None
        self.states: list[torch.Tensor] = []

    def taken(self) -> None:
        """A step has drawn (where it samples)."""
        if self.generator is not None:
            self.states.append(self.generator.get_state())

    def keep(self, tokens: int) -> None:
        """Only the first `tokens` steps' draws stay taken."""
        if self.generator is not None and 0 < tokens < len(self.states):
            self.generator.set_state(self.states[tokens - 1])


def _default_generator(device: torch.device) -> torch.Generator | None:
    """The generator `torch.multinomial` draws from on `device` when given none (None for a device other
    than the CPU and CUDA, hotrod's two: its draws are then not given back)."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator if device.type == "cpu" else None


def all_finished(left: torch.Tensor) -> bool:
    """Whether `left` (any row unfinished, on the host) says none is: the host's one read of a look."""
    return not bool(left)


def ended(out: torch.Tensor, start: int, eos: torch.Tensor) -> int:
    """The host loop's output length: just past the step where the last row emitted its first EOS (every
    row decodes from `start` unfinished), or all of `out` where some row never did."""
    hits = torch.isin(out[:, start:], eos)
    if not bool(hits.any(dim=1).all()):
        return out.shape[1]
    return start + int(hits.int().argmax(dim=1).max()) + 1
