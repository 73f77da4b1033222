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
(fewer than 2 x READ_EVERY steps of device time, once a generation). A chain feeds a finished row its own
argmax rather than the pad token: rows are independent, and that row's later tokens are the pad token.
"""

from __future__ import annotations

import functools

import torch

from hotrod.generation.config import Settings
from hotrod.generation.sampling import argmax, greedy_only, held_back, index_on, process
from hotrod.generation.state import DecodingState

# Steps between the host's looks at whether every row has finished, and the longest chain of steps in one
# call: each look waits for the device (the look before's steps); each step past the last EOS is wasted.
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
    ends = _Ends(s, sequences.shape[0], device)
    tokens = ends.settle(choose(logits, rows[:, :start], s, skip)[:, None])
    rows[:, start:start + 1] = tokens
    length, unread, chains = start + 1, 1, True
    while length < s.max_length:
        if ends.eos is not None and unread >= READ_EVERY:
            unread = 0
            if ends.look():
                break
        steps = chain_length(s, length, READ_EVERY) if chains else 1
        block = None
        if steps > 1:
            block = state.chain(tokens[:, -1], steps, ChainPick(s, length, steps, logits.shape[-1], device))
        chains = chains and (steps == 1 or block is not None)
        if block is None:
            logits = state.step(tokens[:, -1])
            block, steps = choose(logits, rows[:, :length], s, skip)[:, None], 1
        tokens = ends.settle(block)
        rows[:, length:length + steps] = tokens
        length, unread = length + steps, unread + steps
    out = rows[:, :length].cpu()
    return out if ends.eos is None else out[:, :ended(out, start, ends.eos.cpu())]


def chain_length(s: Settings, length: int, most: int) -> int:
    """How many greedy steps may run as one chain from rows of `length` tokens: a power of two up to `most`
    and to `max_length`, with no forced step among them (processors that hold fixed ids back are applied
    inside the chain, `ChainPick`); 1 where none may (sampling, or a processor that reads the rows)."""
    if not greedy_only(s):
        return 1
    steps = 1
    while 2 * steps <= min(most, s.max_length - length):
        steps *= 2
    while steps > 1 and any(held_back(s, at) is None for at in range(length, length + steps)):
        steps //= 2
    return steps


class ChainPick:
    """A chain's choice at each of its steps, inside its one recorded call: the argmax of the scores as
    `hotrod.generation.sampling.process` leaves them for greedy settings that act on fixed ids alone, in
    its order: one-token bad words' -inf added (as its bias), then the ids held back at that step
    (min_length's EOS, suppressed tokens) filled with -inf. `tensors` are copied into the recording's
    inputs at each call (which ids each step holds back); `key` names what else it reads."""

    def __init__(self, s: Settings, length: int, steps: int, vocab: int, device: torch.device):
        banned = tuple(sorted({word[0] for word in s.bad_words_ids}))
        self.bias = bias_on(banned, vocab, device) if banned else None
        bad = set(banned)
        held = [set(held_back(s, length + j)) - bad for j in range(steps)]
        self.tensors: list[torch.Tensor] = []
        if any(held):
            fill = torch.zeros((steps, vocab), dtype=torch.bool)
            for j, ids in enumerate(held):
                fill[j, sorted(ids)] = True
            self.tensors.append(fill)
        self.key = (banned, bool(self.tensors))

    def __call__(self, logits: torch.Tensor, step: int, *tensors: torch.Tensor) -> torch.Tensor:
        """Step `step`'s tokens [rows] from its logits [rows, vocab], over fp32 scores as the host's are."""
        scores = logits.float()
        if self.bias is not None:
            scores = scores + self.bias
        if tensors:
            scores = scores.masked_fill(tensors[0][step], -float("inf"))
        return scores.argmax(dim=-1)


@functools.lru_cache(maxsize=16)
def bias_on(banned: tuple[int, ...], vocab: int, device: torch.device) -> torch.Tensor:
    """-inf at the `banned` ids, 0 elsewhere: made once, and never freed while a recording may read it."""
    return torch.zeros(vocab, device=device).index_fill_(0, index_on(banned, device), -float("inf"))


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
        hits = torch.isin(block, self.eos)
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
