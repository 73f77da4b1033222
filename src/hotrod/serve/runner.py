"""The model side of the server: runs what the scheduler decided, on a HotrodModel.

`GenerationRunner` executes the scheduler's plan: it frees the slots of the requests the plan releases,
steps the rows the plan names, and prefills those it admits. Which requests run is the scheduler's to
know; the runner only maps them to the slots of its decoding state (`hotrod.serve.slots`). Each row's
tokens are chosen as its request would get them alone (`hotrod.serve.picks`); a row whose choice fails
fails alone, never its batch-mates. Encoders' requests run in `hotrod.serve.encoder_runner`.

The running batch is one decoding state whose rows are slots. Joining
requests are prefilled in sub-batches of similar length; their rows take free slots, and the rest are
appended to the batch. Every step runs the batch once, feeding each row its last token; finished rows
leave at once.

The batch needs no padding: every row keeps its own length in cache buffers the graph updates in place
(`hotrod.generation.self_cache.SelfCache`), so rows that arrived at different steps share one call.

A request that speculates (`hotrod.serve.speculation`) drafts tokens from its own text. When any row of
the batch has a draft, the step is one verifying pass instead: every row is fed its last token and its
draft (padded to the longest), each row keeps its draft up to the first token it would not have chosen,
plus that choice, and the cache gives back the rest by each row's length alone. Greedy rows get the
tokens plain decoding gives them, several a step where the text repeats itself; a step where no row
drafts is the plain step, unchanged. onnxruntime's attention verifies drafts of a lone row only: there,
a request speculates while it runs alone (which is when a step leaves the most bandwidth unused).
"""

from __future__ import annotations

import functools

import torch

from hotrod.batching import plan
from hotrod.errors import HotrodError
from hotrod.generation import config as gen_config
from hotrod.generation import draft_rules, search
from hotrod.generation.state import DecodingState
from hotrod.model import HotrodModel, torch_threads
from hotrod.model_inputs import padded_batch
from hotrod.serve.messages import Params
from hotrod.serve.picks import Outcome, RowOptions, accept
from hotrod.serve.scheduler import Request
from hotrod.serve.slots import Group, compact, wanted_positions
from hotrod.serve.speculation import drafts_of

# Positions one verifying pass feeds at most, over all its rows: its logits are as many vocab-sized rows
# (GPT-2, 32 rows of 16: 100 MB), and a large batch's pass is already compute bound on a CPU.
PASS_POSITIONS = 512


class GenerationRunner:
    """`prompt_lookup`: the tokens a request drafts a step when its params do not say (0: none)."""

    def __init__(self, model: HotrodModel, prompt_lookup: int = 0):
        self.model = model
        self.prompt_lookup = prompt_lookup
        self.drafted = self.accepted = 0  # drafted tokens and those kept, since `speculated()` last read them
        self.groups: list[Group] = []  # at most one once a join is done: rows of any length share a state
        # The model's own settings, resolved as generate() resolves them: its EOS ids and start token.
        defaults = model.settings(1, {**gen_config.merge(model.generation_config, None, {}), "max_new_tokens": 1})
        self.eos_ids: tuple[int, ...] = defaults.eos_token_ids
        self.start_token = None if model.spec.continues_prompt else model.decoding_state(defaults).start_token

    def options(self, prompt: list[int], params: Params) -> RowOptions:
        """Resolve a request's settings as `generate()` would; raises HotrodError for a bad combination."""
        values = gen_config.merge(self.model.generation_config, None, params.generate_kwargs())
        return RowOptions(self.model.settings(len(prompt), values), params.seed, self._lookup(params), len(prompt))

    def _lookup(self, params: Params) -> int:
        """The tokens a request drafts a step: its own choice, else the server's (which beams ignore)."""
        if params.prompt_lookup is None:
            return self.prompt_lookup if params.num_beams == 1 else 0
        refusal = draft_rules.refusal(params.num_beams, self.model.backend.verifies_drafts)
        if params.prompt_lookup and refusal:
            raise HotrodError(f"speculate: prompt lookup {refusal}")
        return params.prompt_lookup

    def speculated(self) -> tuple[int, int]:
        """Tokens drafted, and those of them kept, since the last call (the worker's metrics read them)."""
        counts, self.drafted, self.accepted = (self.drafted, self.accepted), 0, 0
        return counts

    @torch.inference_mode()
    def admit(self, requests: list[Request]) -> list[Outcome]:
        """Prefill `requests` and add them to the running batch; returns their first tokens.

        Prompts are prefilled in sub-batches of similar length (`hotrod.batching.plan`): prefill is
        compute bound, and a short prompt padded to a long one would pay for its padding.
        """
        tokens: dict[int, Outcome] = {}
        for part in plan([len(r.prompt) for r in requests], len(requests)):
            group = [requests[i] for i in part]
            tokens.update(zip((r.id for r in group), self._prefill(group)))
        self._merge()  # once for every part: each row is copied once
        return [tokens[r.id] for r in requests]

    def _prefill(self, requests: list[Request]) -> list[Outcome]:
        # Up to a multiple of the model's invariant rows, copies of the first prompt fill the batch: they
        # become free slots, so every request runs on the same kernels alone or among others (`slots.compact`
        # keeps the multiple); prompts are as many columns wide as a multiple of it too.
        multiple = self.model.invariant_rows
        spare = -len(requests) % multiple
        prompts = [r.prompt for r in requests] + [requests[0].prompt] * spare
        ids, mask = padded_batch(prompts, left=self.model.spec.pads_left, multiple=multiple)
        # A cache as wide as the prompts: these rows are copied into the running batch, whose buffers are
        # sized for what every row will need. Sizing the prefill's own for that too doubled the fresh
        # memory the first burst of clients touches, its page faults a large part of the burst's time.
        state = self.model.decoding_state(requests[0].options.settings, capacity=0)
        state.width_multiple = multiple
        with torch_threads(self.model.backend.loop_threads):
            _, logits = state.start(ids, mask, 1)
            tokens = self._pick(logits[: len(requests)], requests, first=True)
        # Cache copies run with all of torch's threads: the worker does nothing else meanwhile.
        left = self._fill_slots(Group(state, [*requests, *[None] * spare]))
        if left.rows:
            self.groups.append(left)
        return tokens

    def slots(self) -> list[Request]:
        """The requests in the decoding state's slots (what the plans so far have put there)."""
        return [r for group in self.groups for r in group.rows if r is not None]

    @torch.inference_mode()
    def step(self, requests: list[Request]) -> list[Outcome]:
        """One decoding step for `requests`, the plan's running rows: their outcomes, in their order.

        Free slots are fed a dummy token and not read. The rows must be exactly those the plans put in
        the slots; anything else is a bug, refused before the model runs.
        """
        held = self.slots()
        if sorted(r.id for r in held) != sorted(r.id for r in requests):
            raise RuntimeError("the plan's running rows differ from the runner's slots")
        outcomes: dict[int, Outcome] = {}
        with torch_threads(self.model.backend.loop_threads):
            for group in self.groups:
                live = [i for i, r in enumerate(group.rows) if r is not None]
                rows: list[Request] = [group.rows[i] for i in live]  # type: ignore[misc]
                drafts = self._drafts(group)
                if any(drafts):
                    found = self._speculate(group, rows, live, drafts)
                else:
                    last = torch.tensor([r.tokens[-1] if r is not None else 0 for r in group.rows])
                    logits = group.state.step(last)
                    if len(live) < len(group.rows):  # a full batch is read in place: [32, 50257] is 6 MB a copy
                        logits = logits[live]
                    found = self._pick(logits, rows)
                outcomes.update(zip((r.id for r in rows), found))
        return [outcomes[r.id] for r in requests]

    def _drafts(self, group: Group) -> list[list[int]]:
        """Each slot's draft this step; none where no row speculates, or where the backend cannot verify
        them (onnxruntime's attention verifies a lone row only)."""
        if not any(r is not None and r.options.drafter is not None for r in group.rows):
            return []
        if not self.model.backend.verifies_batches and len(group.rows) > 1:
            return []
        return drafts_of(group.rows, min(group.state.headroom, PASS_POSITIONS // len(group.rows)) - 1)

    def _speculate(self, group: Group, rows: list[Request], live: list[int], drafts: list[list[int]]) -> list[Outcome]:
        """One verifying pass of `group`: the tokens of its `rows` (in slots `live`). Every slot is fed
        its last token and its draft, padded to the longest; then each row's cache keeps its last token
        and the drafted tokens it kept, and a free slot ends at the length it had."""
        width = 1 + max(map(len, drafts))
        fed = torch.zeros(len(group.rows), width, dtype=torch.long)
        for i, row in zip(live, rows):
            fed[i, : 1 + len(drafts[i])] = torch.tensor([row.tokens[-1], *drafts[i]])
        logits = group.state.verify(fed)
        if len(live) < len(group.rows):
            logits = logits[live]
        found = accept(logits, rows, [drafts[i] for i in live], functools.partial(self._history, first=False))
        back = torch.full((len(group.rows),), width)
        for i, row, outcome in zip(live, rows, found):
            back[i] -= len(outcome) if isinstance(outcome, list) else 1
            if drafts[i] and isinstance(outcome, list):
                row.options.drafter.judged(len(outcome) - 1)
                self.drafted += len(drafts[i])
                self.accepted += len(outcome) - 1
        group.state.rewind(back)
        return found

    @torch.inference_mode()
    def release(self, requests: list[Request]) -> None:
        """Free the slots of `requests` (those the runner does not hold are ignored)."""
        gone = set(map(id, requests))
        for group in self.groups:
            leaving = [i for i, r in enumerate(group.rows) if r is not None and id(r) in gone]
            group.state.release(leaving)
            group.rows = [None if i in leaving else r for i, r in enumerate(group.rows)]
            live = [r for r in group.rows if r is not None]
            # Compact when most slots are free: the steps saved cost more than the one copy. A lone row
            # that speculates is compacted too where only a lone row's drafts can be verified.
            lone = (len(live) == 1 and live[0].options.drafter is not None and self.model.invariant_rows == 1
                    and not self.model.backend.verifies_batches)
            if 2 * len(group.free()) > len(group.rows) or (lone and group.free()):
                compact(group, force=True, least=self.model.invariant_rows)
            if leaving and live:
                group.state.fit(max(r.options.settings.max_length for r in group.rows if r is not None))
        self.groups = [g for g in self.groups if g.rows]
        self._merge()

    def _fill_slots(self, new: Group) -> Group:
        """Put rows of `new` into free slots of groups that have room; returns what is left of `new`."""
        for group in self.groups:
            pairs = list(zip(group.free(), range(len(new.rows))))
            if not pairs or not group.state.room_for(new.state):
                continue
            group.state.reserve(wanted_positions(new.rows[row] for _, row in pairs))
            group.state.place(new.state, pairs)
            for slot, row in pairs:
                group.rows[slot] = new.rows[row]
                new.rows[row] = None
            compact(new, least=self.model.invariant_rows)
            if not new.rows:
                break
        return new

    def reset(self) -> None:
        self.groups = []

    def _merge(self) -> None:
        """Join every group into the first, all at once: rows of different lengths cost nothing extra
        together, and one join copies each row once (joining groups one by one recopied the first group's
        rows at every join: with 32 clients arriving together, most of the server's time)."""
        if not self.groups:
            return
        wanted = wanted_positions(row for group in self.groups for row in group.rows)
        if len(self.groups) == 1:
            self.groups[0].state.join([], wanted)  # rows prefilled with their prompts' room only
            return
        for group in self.groups:  # a join copies the cache anyway: leave the free slots behind
            compact(group, least=self.model.invariant_rows)
        first, others = self.groups[0], self.groups[1:]
        first.state.join([other.state for other in others], wanted)
        first.rows += [row for other in others for row in other.rows]
        self.groups = [first]

    @torch.inference_mode()
    def run_whole(self, request: Request) -> list[int] | None:
        """Beam search, run alone by the decoding loop; the new tokens, or None if the request was
        cancelled (its ticket is checked before every step, so a cancelled beam stops at once)."""
        settings = request.options.settings
        state = _Cancellable(self.model.decoding_state(settings), request)
        ids = torch.tensor([request.prompt])
        try:
            with torch_threads(self.model.backend.loop_threads):
                out = search.generate(state, ids, torch.ones_like(ids), settings,  # type: ignore[arg-type]
                                      request.options.generator)  # a seeded beam sample draws from its own stream
        except _Cancelled:
            return None
        return self.model.spec.generated(out[0], len(request.prompt)).tolist()

    def _pick(self, logits: torch.Tensor, requests: list[Request], first: bool = False) -> list[Outcome]:
        """Each row's next token from its logits [rows, vocab]: a verifying pass with no draft."""
        history = functools.partial(self._history, first=first)
        return accept(logits[:, None], requests, [[] for _ in requests], history)

    def _history(self, request: Request, first: bool) -> list[int]:
        """The row as the decoding loop would hold it: prompt (or start token) plus what was generated."""
        return self.model.spec.history(request.prompt, [] if first else request.tokens, self.start_token)


class _Cancelled(Exception):
    pass


class _Cancellable:
    """A decoding state that stops the decoding loop when its request is cancelled (checked every step)."""

    def __init__(self, state: DecodingState, request: Request):
        self._state = state
        self._request = request

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._request.cancelled:
            raise _Cancelled()
        return self._state.step(tokens)

    def __getattr__(self, name: str):
        return getattr(self._state, name)
