"""A model-free `Worker` for testing the HTTP layer: deterministic tokens from a thread of its own.

It behaves like a real worker where the app can tell: tickets are fed from another thread through
`Ticket.push`, the queue has a bound (QueueFull), a batch can fail (BatchFailed), a stopping worker refuses
work (ShuttingDown), and a cancelled ticket ends with finish_reason "cancelled" at the next step. What it
generates is arithmetic, so a test can predict every token: token i of a prompt is (sum(prompt) + i) % vocab.
"""

from __future__ import annotations

import string
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from hotrod import kinds
from hotrod.pipelines import languages
from hotrod.pipelines.sentence_tokens import Tokenized
from hotrod.serve.messages import BatchFailed, Event, ModelInfo, Params, QueueFull, ShuttingDown, Ticket, TokenLogprobs

FAIL_TOKEN = 66  # a prompt holding this id fails its batch ("B" encodes to it)
_ALPHABET = string.ascii_letters + string.digits + " .,;:!?-_()[]{}<>/\\|@#$%^&*+=~'\""


def expected_tokens(prompt: list[int], count: int, vocab_size: int = 100) -> list[int]:
    """What the fake generates for `prompt`: the tests' oracle."""
    return [(sum(prompt) + i) % vocab_size for i in range(count)]


def fake_logprobs(token: int, step: int, top: int | None, vocab_size: int = 100) -> list[TokenLogprobs] | None:
    """What the fake reports with token number `step` (from 1) when asked for `top` logprobs."""
    if top is None:
        return None
    chosen = -0.25 * step
    alternatives = [(token, chosen)] + [((token + k) % vocab_size, chosen - k) for k in range(1, top)]
    return [TokenLogprobs(chosen, alternatives[:top])]


def expected_embedding(row: list[int], hidden: int = 8, normalize: bool = False) -> list[float]:
    vector = torch.tensor([float((sum(row) + j) % 17) + 1.0 for j in range(hidden)])
    if normalize:
        vector = vector / vector.norm()
    return vector.tolist()


@dataclass
class _Job:
    ticket: Ticket
    prompt: list[list[int]] | list[int]
    params: Params | None = None  # None: an embedding job
    pooling: str | None = None
    normalize: bool = False
    step: int = 0


@dataclass
class FakeWorker:
    """`delay` is the time of one decoding step; `max_pending` bounds running + waiting requests."""

    name: str = "fake"
    kind: str = "decoder"
    vocab_size: int = 100
    max_positions: int | None = 64
    delay: float = 0.002
    max_pending: int | None = None
    hidden: int = 8
    retry_after: float = 0.3
    fail_after: int = 0  # tokens a FAIL_TOKEN prompt gets before its batch fails
    submitted: list[tuple[list, Params | None]] = field(default_factory=list)
    cancelled: list[Ticket] = field(default_factory=list)
    tickets: list[Ticket] = field(default_factory=list)
    stopped_with: list[bool] = field(default_factory=list)
    died: str | None = None  # set: the worker has died
    verifies_drafts: bool = True  # as a decoder on onnxruntime or torch: requests may speculate
    tokenizer: Any = None  # what target_language is resolved through (`hotrod.pipelines.languages`); None: none

    def __post_init__(self) -> None:
        self.info = ModelInfo(name=self.name, kind=self.kind, vocab_size=self.vocab_size,
                              max_positions=self.max_positions, created=1_700_000_000, path=f"/models/{self.name}",
                              verifies_drafts=self.verifies_drafts and kinds.spec(self.kind).generates,
                              width=0 if kinds.spec(self.kind).generates else self.hidden)
        self._jobs: list[_Job] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = False
        self._accepting = True

    # -- tokenizer ---------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(_ALPHABET[i % len(_ALPHABET)] for i in ids)

    def forced_bos(self, target_language: str, forced_bos_token_id: int | None) -> int:
        return languages.forced_bos(self.tokenizer, target_language, forced_bos_token_id, self.vocab_size)

    # -- submission --------------------------------------------------------------------------------------
    def submit_generate(self, prompt: list[int], params: Params) -> Ticket:
        return self._submit(_Job(Ticket(), list(prompt), params))

    def embedding_tokens(self, texts: list[str], prompt: str | None, truncate: bool, side: str) -> Tokenized:
        """No pipeline of its own: the prompt before each text, cut at the positions when asked."""
        rows = [self.encode((prompt or "") + text) for text in texts]
        if truncate and self.max_positions is not None:
            rows = [row[: self.max_positions] if side == "right" else row[-self.max_positions:] for row in rows]
        return Tokenized(rows, len(self.encode(prompt)) if prompt else 0)

    def submit_embed(self, rows: list[list[int]], pooling: str | None, normalize: bool | None,
                     prompt_length: int = 0) -> Ticket:
        return self._submit(_Job(Ticket(), [list(r) for r in rows], None, pooling, bool(normalize)))

    def _submit(self, job: _Job) -> Ticket:
        with self._lock:
            if not self._accepting:
                raise ShuttingDown()
            if self.max_pending is not None and len(self._jobs) >= self.max_pending:
                raise QueueFull(self.retry_after)
            job.ticket.submitted = time.perf_counter()
            self._jobs.append(job)
            self.submitted.append((job.prompt, job.params))
            self.tickets.append(job.ticket)
        self._wake.set()
        return job.ticket

    def queue_depth(self) -> int:
        with self._lock:
            return len(self._jobs)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._halt.clear()
        self._thread = threading.Thread(target=self._run, name=f"fake-{self.name}", daemon=True)
        self._thread.start()
        self._ready = True

    def ready(self) -> bool:
        return self._ready and self.died is None

    def failure(self) -> str | None:
        return self.died

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        self.stopped_with.append(drain)
        with self._lock:
            self._accepting = False
        while drain and self.queue_depth() and self._thread is not None and self._thread.is_alive():
            time.sleep(0.005)
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._ready = False

    # -- the "model" -------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._halt.is_set():
            with self._lock:
                batch = list(self._jobs)
            if not batch:
                self._wake.wait(0.01)
                self._wake.clear()
                continue
            time.sleep(self.delay)
            for job in batch:
                if self._step(job):
                    with self._lock:
                        self._jobs.remove(job)

    def _step(self, job: _Job) -> bool:
        """Advance one job by one step; True when it has ended."""
        ticket = job.ticket
        if ticket.started is None:
            ticket.started = time.perf_counter()
        if ticket.cancelled:
            self.cancelled.append(ticket)
            ticket.push(Event(finish_reason="cancelled"))
            return True
        if job.params is None:
            rows = torch.tensor([expected_embedding(r, self.hidden, job.normalize) for r in job.prompt])
            ticket.push(Event(finish_reason="stop", result=rows))
            return True
        if FAIL_TOKEN in job.prompt and job.step >= self.fail_after:
            ticket.push(Event(error=BatchFailed("the batch failed: injected fault")))
            return True
        token = (sum(job.prompt) + job.step) % self.vocab_size
        job.step += 1
        done = job.step >= job.params.max_new_tokens
        ticket.push(Event(tokens=[token], logprobs=fake_logprobs(token, job.step, job.params.logprobs, self.vocab_size),
                          finish_reason="length" if done else None))
        return done
