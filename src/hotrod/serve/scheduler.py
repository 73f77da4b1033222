"""Who runs next: continuous batching for generation, dynamic batching for encoders.

The schedulers decide and the runner executes; they exchange `Request`s, plain records that carry the
client's ticket without looking inside it. Nothing here knows about models, tensors or ONNX, so each
policy is tested with a fake runner.

Generation policies:
- "continuous": iteration-level batching. Every decoding step, waiting requests join the running batch
  while it has rows and KV-cache budget left; a finished request leaves at once and frees its share.
- "request": request-level batching, as a dynamic batcher does it: a batch starts when the previous one
  has finished completely, so short generations wait for the longest one in their batch.
- "none": one request at a time.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hotrod.generation.self_cache import rounded_positions
from hotrod.serve.messages import Params, QueueFull

POLICIES = ("continuous", "request", "none")
_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """One client request as the scheduler sees it. `rows` holds an encoder request's rows: token id lists to
    embed, or a task's `Row`s; the scheduler reads only their lengths."""

    ticket: Any  # has .cancelled; the scheduler never reads anything else of it
    prompt: list[int] = field(default_factory=list)
    params: Params = field(default_factory=Params)
    rows: list[Any] = field(default_factory=list)
    options: Any = None  # what the runner needs beyond the params (resolved settings, pooling)
    arrived: float = field(default_factory=time.perf_counter)
    tokens: list[int] = field(default_factory=list)
    started: float | None = None
    finish_reason: str | None = None
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def footprint(self) -> int:
        """Cache positions this request may need: its prompt plus every token it may generate."""
        return len(self.prompt) + self.params.max_new_tokens

    @property
    def cancelled(self) -> bool:
        return bool(getattr(self.ticket, "cancelled", False))


@dataclass
class Plan:
    """One iteration, for the runner to execute in this order.

    `release`: rows whose cache slots the runner frees (they finished, failed or were cancelled since the
    last plan); `step`: the running rows, each decoded one token; `admit`: newcomers to prefill into the
    batch; `whole`: a beam request, run alone between steps. `cancelled` are the requests the worker tells
    so (those that ran are in `release` too).
    """

    release: list[Request] = field(default_factory=list)
    step: list[Request] = field(default_factory=list)
    admit: list[Request] = field(default_factory=list)
    whole: Request | None = None
    cancelled: list[Request] = field(default_factory=list)


class ContinuousScheduler:
    """Generation requests under a row limit and a KV-cache budget counted in padded cache positions.

    It alone knows which requests run: a request joins `running` when a plan admits it and leaves it when
    `record` sees it finish, `fail` drops it, or its client cancels; the next plan then tells the runner
    to free its slot. The runner keeps no list of its own to be kept in step.
    """

    def __init__(self, max_batch_size: int, kv_budget: int, max_queue: int, eos_ids: tuple[int, ...] = (),
                 policy: str = "continuous"):
        if policy not in POLICIES:
            raise ValueError(f"unknown batching policy {policy!r}; choose from {', '.join(POLICIES)}")
        self.max_batch_size = 1 if policy == "none" else max_batch_size
        self.kv_budget = kv_budget
        self.max_queue = max_queue
        self.eos_ids = set(eos_ids)
        self.policy = policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._released: list[Request] = []  # left `running` since the last plan

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.max_queue:
            raise QueueFull(retry_after=1.0)
        self.waiting.append(request)

    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def plan(self) -> Plan:
        cancelled = self._drop_cancelled()
        plan = Plan(cancelled=cancelled, step=list(self.running))
        plan.release, self._released = self._released, []
        plan.release += cancelled  # the runner frees those it holds and ignores the rest
        if self.policy != "continuous":
            if not self.running and self.waiting and self.waiting[0].params.num_beams > 1:
                plan.whole = self.waiting.popleft()  # request-level: a beam request is a batch of its own
            elif not self.running:
                self._admit(plan)
            return plan
        self._admit(plan)
        return plan

    def _admit(self, plan: Plan) -> None:
        """Admit waiting requests in order while they fit; the first beam request met runs whole, without
        holding back the requests behind it."""
        while self.waiting:
            head = self.waiting[0]
            if head.params.num_beams > 1:
                if plan.whole is not None:
                    break
                plan.whole = self.waiting.popleft()
                continue
            if not self._fits(head, plan.admit):
                break
            plan.admit.append(self.waiting.popleft())
        self.running += plan.admit

    def record(self, request: Request, token: int) -> bool:
        """Add one generated token; True when the request has finished (it leaves `running` at once)."""
        if token in self.eos_ids:
            request.finish_reason = "stop"
        else:
            request.tokens.append(token)
            request.finish_reason = "length" if len(request.tokens) >= request.params.max_new_tokens else None
        if request.finish_reason is not None:
            self._leave([request])
        return request.finish_reason is not None

    def fail(self, requests: list[Request]) -> None:
        """Drop requests whose run failed; their slots are freed with the next plan."""
        self._leave(requests)

    def fail_running(self) -> list[Request]:
        failed, self.running = self.running, []
        self._released += failed
        return failed

    def _leave(self, requests: list[Request]) -> None:
        gone = {id(r) for r in requests}
        leaving = [r for r in self.running if id(r) in gone]
        self.running = [r for r in self.running if id(r) not in gone]
        self._released += leaving

    def _fits(self, request: Request, admitted: list[Request]) -> bool:
        batch = [*self.running, *admitted]
        if not batch:
            return True  # alone, a request always runs: the app has bounded it by the model's positions
        if len(batch) + 1 > self.max_batch_size:
            return False
        rows = [*batch, request]
        return len(rows) * rounded_positions(max(r.footprint for r in rows)) <= self.kv_budget  # as the cache holds them

    def _drop_cancelled(self) -> list[Request]:
        gone = [r for r in (*self.waiting, *self.running) if r.cancelled]
        if gone:
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
            self.running = [r for r in self.running if not r.cancelled]
        return gone


class DynamicBatcher:
    """Encoder requests: a batch goes when it is full or its oldest request has waited `max_delay_s`.

    The batch is the oldest request plus the waiting ones closest to it in length, so one call pads
    little; the model's own padding-free forward then splits the batch further by length.
    """

    def __init__(self, max_batch_size: int, max_delay_s: float, max_queue: int):
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self.waiting: list[Request] = []

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.max_queue:
            raise QueueFull(retry_after=1.0)
        self.waiting.append(request)

    def busy(self) -> bool:
        return bool(self.waiting)

    def drop_cancelled(self) -> list[Request]:
        gone = [r for r in self.waiting if r.cancelled]
        self.waiting = [r for r in self.waiting if not r.cancelled]
        return gone

    def next_batch(self, now: float, flush: bool = False) -> list[Request] | float | None:
        """A batch to run now, else the seconds until one is due (None: nothing waits)."""
        if not self.waiting:
            return None
        oldest = self.waiting[0]
        due = oldest.arrived + self.max_delay_s - now
        if sum(len(r.rows) for r in self.waiting) < self.max_batch_size and due > 0 and not flush:
            return due
        target = _length(oldest)
        batch, rows = [oldest], len(oldest.rows)
        for request in sorted(self.waiting[1:], key=lambda r: (abs(_length(r) - target), r.arrived)):
            if rows + len(request.rows) > self.max_batch_size:
                continue
            batch.append(request)
            rows += len(request.rows)
        chosen = set(map(id, batch))
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        return batch


def _length(request: Request) -> float:
    return max((len(row) for row in request.rows), default=0)
