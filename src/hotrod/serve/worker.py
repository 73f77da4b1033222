"""A served model: its tokenizer, scheduler and runner, driven by one worker thread.

The app submits requests from the event loop; the worker thread owns the model and runs the loop
plan -> execute -> record. The scheduler alone knows which requests run; the runner executes its plan
and returns an outcome per row, and the worker hands each outcome to its request's ticket as it happens
(a streaming client sees each token the step it is produced) and back to the scheduler.

Failures stay as small as they can: a row whose token choice fails is failed alone; a failure of the
batched forward itself fails the rows of that call; a worker that dies fails everything it holds with
WorkerDown, refuses what comes after, and says so through `failure()`, so the server can exit and be
restarted. Exception text goes to the log, never to a client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotrod import tasks
from hotrod.errors import HotrodError, check_number, first_line
from hotrod.generation import draft_rules
from hotrod.model import HotrodModel
from hotrod.pipelines import languages, sentence
from hotrod.pipelines.base import Row
from hotrod.pipelines.sentence_tokens import Tokenized, tokenize
from hotrod.runtime.base import RuntimeOptions
from hotrod.serve.encoder_runner import HIDDEN, ROWS, EncoderRunner
from hotrod.serve.messages import BatchFailed, Event, ModelInfo, Params, ShuttingDown, Ticket, WorkerDown
from hotrod.serve.metrics import Metrics
from hotrod.serve.picks import Outcome, Pick
from hotrod.serve.runner import GenerationRunner
from hotrod.serve.scheduler import POLICIES, ContinuousScheduler, DynamicBatcher, Plan, Request
from hotrod.serve.slots import position_bytes

log = logging.getLogger("hotrod.serve")


@dataclass(frozen=True)
class ServeOptions:
    """How each model is scheduled. `kv_cache_mb` bounds the running batch's cache (padded positions);
    `prompt_lookup` is the tokens a generation request drafts a step when it does not say (0: none;
    `hotrod.serve.speculation`)."""

    max_batch_size: int = 32
    max_queue_delay_ms: float = 5.0
    max_queue: int = 256
    kv_cache_mb: float = 1024.0
    batching: str = "continuous"  # continuous | request | none (generation)
    prompt_lookup: int = 0

    def __post_init__(self):
        for name in ("max_batch_size", "max_queue"):
            if getattr(self, name) < 1:
                raise HotrodError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_number("max_queue_delay_ms", self.max_queue_delay_ms, 0, 60_000)
        check_number("kv_cache_mb", self.kv_cache_mb, 0, 2**30)
        draft_rules.draft_count("prompt_lookup", self.prompt_lookup, least=0)
        if self.batching not in POLICIES:
            raise HotrodError(f"unknown batching {self.batching!r}; choose from {', '.join(POLICIES)}")


def _precision(model: HotrodModel) -> str:
    """What the model computes in: its artifact's precision, or its engine's; fp32 for a checkpoint as it is."""
    built = ((model.manifest or {}).get("options") or {}).get("precision")
    return built or getattr(getattr(model.backend, "options", None), "precision", None) or "fp32"


class ModelWorker:
    def __init__(self, name: str, model: HotrodModel, options: ServeOptions, metrics: Metrics | None = None,
                 path: str = ""):
        self.model = model
        self.options = options
        self.metrics = metrics or Metrics()
        dims = model.dims
        verifies = model.spec.generates and model.backend.verifies_drafts
        self.info = ModelInfo(name, model.kind, model.config.vocab_size, dims.max_positions, int(time.time()), path,
                              model.task, tuple(model.labels[i] for i in sorted(model.labels)), verifies,
                              sentence.width(model) if model.spec.encodes else 0, model.sentence,
                              _precision(model), options.max_batch_size, options.max_queue)
        self._cond = threading.Condition()
        self._accepting = True
        self._ready = False
        self._stop = False
        self._failure: str | None = None
        self._thread: threading.Thread | None = None
        if not model.spec.generates:
            self.runner = EncoderRunner(model)
            self.scheduler = DynamicBatcher(options.max_batch_size, options.max_queue_delay_ms / 1000,
                                            options.max_queue)
        else:
            if options.prompt_lookup and not verifies:
                raise HotrodError(f"model {name!r} cannot speculate (prompt lookup of {options.prompt_lookup} "
                                  f"tokens): {draft_rules.NO_VERIFY}; serve it without --speculate")
            self.runner = GenerationRunner(model, options.prompt_lookup)
            budget = int(options.kv_cache_mb * 2**20 // position_bytes(model))
            self.scheduler = ContinuousScheduler(options.max_batch_size, budget, options.max_queue,
                                                 self.runner.eos_ids, options.batching)

    # -- tokenizer --------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        if self.model.tokenizer is None:
            raise HotrodError(f"model {self.info.name!r} has no tokenizer; send token_ids")
        return list(self.model.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        if self.model.tokenizer is None:
            return ""
        return self.model.tokenizer.decode(ids, skip_special_tokens=True)

    def forced_bos(self, target_language: str, forced_bos_token_id: int | None) -> int:
        return languages.forced_bos(self.model.tokenizer, target_language, forced_bos_token_id, self.info.vocab_size)

    # -- submission (event loop) --------------------------------------------------------------------

    def submit_generate(self, prompt: list[int], params: Params) -> Ticket:
        options = self.runner.options(prompt, params)  # HotrodError for a bad combination: the app's 400
        return self._submit(Request(Ticket(), prompt=list(prompt), params=params, options=options))

    def embedding_tokens(self, texts: list[str], prompt: str | None, truncate: bool, side: str) -> Tokenized:
        return tokenize(self.model, texts, prompt, truncate, side)

    def submit_embed(self, rows: list[list[int]], pooling: str | None, normalize: bool | None,
                     prompt_length: int = 0) -> Ticket:
        return self._submit(Request(Ticket(), rows=[list(r) for r in rows],
                                    options=(pooling, normalize, prompt_length)))

    def submit_hidden(self, rows: list[list[int]]) -> Ticket:
        return self._submit(Request(Ticket(), rows=[list(r) for r in rows], options=HIDDEN))

    def submit_rows(self, rows: list[Row]) -> Ticket:
        return self._submit(Request(Ticket(), rows=list(rows), options=ROWS))

    def pipeline_model(self) -> HotrodModel:
        return self.model

    def _submit(self, request: Request) -> Ticket:
        request.ticket.submitted = request.arrived
        with self._cond:
            if self._failure is not None:
                raise WorkerDown(self._failure)
            if not self._accepting:
                raise ShuttingDown()
            self.scheduler.add(request)  # QueueFull past the bound
            self._cond.notify()
        return request.ticket

    def queue_depth(self) -> int:
        return len(self.scheduler.waiting)

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Warm up (the first runs build kernels and buffers), then start the worker thread."""
        self._warm_up()
        self._thread = threading.Thread(target=self._loop, name=f"hotrod-{self.info.name}", daemon=True)
        self._thread.start()
        self._ready = True

    def ready(self) -> bool:
        return self._ready and not self._stop and self._failure is None

    def failure(self) -> str | None:
        return self._failure

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        with self._cond:
            self._accepting = False
            if not drain:
                self._fail_all(ShuttingDown())
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # draining took too long: what is left ends now
                log.error("model %s did not drain within %s s; failing what it still holds", self.info.name, timeout)
                with self._cond:
                    self._fail_all(ShuttingDown())
        self._ready = False

    def _warm_up(self) -> None:
        if self.model.spec.generates:
            self.model.generate([[1, 2, 3]], max_new_tokens=2)
        elif tasks.get(self.model.task).embeds:
            self.model.embed([[1, 2, 3]])
        else:  # a head has no embeddings: its rows' forward is what it serves
            self.model.run_rows([Row([1, 2, 3])])

    def _fail_all(self, error: BaseException) -> None:
        """End every request the worker holds with `error` (under the lock)."""
        waiting = list(self.scheduler.waiting)
        self.scheduler.waiting.clear()
        running = self.scheduler.fail_running() if isinstance(self.scheduler, ContinuousScheduler) else []
        for request in waiting + running:
            if not request.ticket.done:
                request.ticket.push(Event(error=error))

    # -- the thread ------------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve_loop()
        except BaseException as exc:  # noqa: BLE001  (a dead worker must say so, not leave requests hanging)
            log.error("model %s: the worker died: %r", self.info.name, exc, exc_info=exc)
            with self._cond:
                self._failure = first_line(exc)
                self._accepting = False
                self._fail_all(WorkerDown(self._failure))

    def _serve_loop(self) -> None:
        iteration = self._generation_iteration if self.model.spec.generates else self._encoder_iteration
        while True:
            with self._cond:
                while not self.scheduler.busy() and not self._stop:
                    self._cond.wait()
                if self._stop and not self.scheduler.busy():
                    return
            iteration()

    def _generation_iteration(self) -> None:
        with self._cond:
            plan: Plan = self.scheduler.plan()
        for request in plan.cancelled:
            request.ticket.push(Event(finish_reason="cancelled"))
        self.runner.release(plan.release)
        if plan.step:
            self._execute(plan.step, lambda: self.runner.step(plan.step), reset=True)
        if plan.admit:
            for request in plan.admit:
                self._started(request)
            self._execute(plan.admit, lambda: self.runner.admit(plan.admit), reset=False)
        if plan.whole is not None:
            self._run_whole(plan.whole)
        self._report_queue()

    def _execute(self, requests: list[Request], work: Callable[[], list[Outcome]], reset: bool) -> None:
        """Run one call of the runner over `requests` and record each row's outcome.

        If the call itself raises, its rows fail (a failed step leaves the running cache in an unknown
        state, so the runner starts afresh); requests outside the call go on.
        """
        try:
            outcomes = work()
        except Exception as exc:  # noqa: BLE001  (any fault of one call must not stop the server)
            if reset:
                self.runner.reset()
            self._fail(requests, exc)
            return
        self.metrics.batch(self.info.name, self.info.kind, len(requests))
        drafted, accepted = self.runner.speculated()  # type: ignore[union-attr]
        if drafted:
            self.metrics.drafts(self.info.name, drafted, accepted)
        for request, outcome in zip(requests, outcomes):
            if isinstance(outcome, BaseException):
                self._fail([request], outcome)
            else:
                self._record(request, outcome)

    def _record(self, request: Request, picks: list[Pick]) -> None:
        """Hand a row's new tokens to the scheduler in order, up to the request's end (the rest of a kept
        draft is dropped), and to its ticket one event per token, as a plain step sends them."""
        finished, taken = False, []
        with self._cond:
            for pick in picks:
                before = len(request.tokens)
                finished = self.scheduler.record(request, pick.token)
                taken.append((request.tokens[before:], pick.logprobs))  # an EOS is not sent
                if finished:
                    break
        self.metrics.tokens(self.info.name, sum(len(fresh) for fresh, _ in taken))
        for n, (fresh, logprobs) in enumerate(taken):
            sent = [logprobs] if fresh and logprobs is not None else None
            if finished and n == len(taken) - 1:
                request.ticket.push(Event(tokens=fresh, logprobs=sent, finish_reason=request.finish_reason))
            elif fresh:
                request.ticket.push(Event(tokens=fresh, logprobs=sent))

    def _fail(self, requests: list[Request], exc: BaseException) -> None:
        """Fail `requests`: the log gets the detail, each ticket an error the app turns into a 500."""
        log.error("model %s: running %d request(s) failed: %r", self.info.name, len(requests), exc, exc_info=exc)
        if isinstance(self.scheduler, ContinuousScheduler):
            with self._cond:
                self.scheduler.fail(requests)
        for request in requests:
            request.ticket.push(Event(error=BatchFailed(first_line(exc))))

    def _run_whole(self, request: Request) -> None:
        self._started(request)
        try:
            tokens = self.runner.run_whole(request)
        except Exception as exc:  # noqa: BLE001
            return self._fail([request], exc)
        if tokens is None:
            request.ticket.push(Event(finish_reason="cancelled"))
            return
        # The scheduler's own record() ends the request at its first EOS, as in a batch; what follows in
        # the decoding loop's output is padding. A whole request never enters `running`.
        for token in tokens:
            if self.scheduler.record(request, token):
                break
        self.metrics.batch(self.info.name, self.info.kind, 1)
        self.metrics.tokens(self.info.name, len(request.tokens))
        request.ticket.push(Event(tokens=request.tokens, finish_reason=request.finish_reason or "length"))

    def _encoder_iteration(self) -> None:
        with self._cond:
            for request in self.scheduler.drop_cancelled():
                request.ticket.push(Event(finish_reason="cancelled"))
            batch = self.scheduler.next_batch(time.perf_counter(), flush=self._stop)
            if batch is None:
                return
            if isinstance(batch, float):
                self._cond.wait(timeout=batch)  # a new arrival may fill the batch sooner
                return
        for request in batch:
            self._started(request)
        self.metrics.batch(self.info.name, self.info.kind, sum(len(r.rows) for r in batch))
        try:
            results = self.runner.run(batch)
        except Exception as exc:  # noqa: BLE001
            self._fail(batch, exc)
        else:
            for request, result in zip(batch, results):
                request.ticket.push(Event(finish_reason="stop", result=result))
        self._report_queue()

    def _started(self, request: Request) -> None:
        request.started = request.ticket.started = time.perf_counter()
        self.metrics.queue_wait(self.info.name, request.started - request.arrived)

    def _report_queue(self) -> None:
        running = len(getattr(self.scheduler, "running", []))
        self.metrics.queue(self.info.name, len(self.scheduler.waiting), running)


def served_names(dirs: list[str] | tuple[str, ...]) -> list[str]:
    """The name each artifact directory is served under (its folder's); two alike are refused."""
    names = [Path(directory).resolve().name for directory in dirs]
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:
        raise HotrodError(f"two models would both be served as {twice!r}; serve them from differently named folders")
    return names


RUNTIME_CHOICES = ("backend", "device", "precision")
_OPTION_OF = {"backend": "backend", "device": "device", "precision": "engine_precision"}  # the user's option names


def told_choices(given: Callable[[str], Any]) -> tuple[str, ...]:
    """The runtime fields a user chose, from `given(option)` (None: not given): `hotrod serve`'s flags and
    a Serve config's args name them alike."""
    return tuple(field for field in RUNTIME_CHOICES if given(_OPTION_OF[field]) is not None)


def load_workers(dirs: list[str], options: ServeOptions, runtime: RuntimeOptions, metrics: Metrics,
                 told: tuple[str, ...] = RUNTIME_CHOICES) -> dict[str, ModelWorker]:
    """One worker per artifact directory, named after the directory; names must be unique. `told` names the
    fields of `runtime` the user chose; the others are left to each artifact (an engine artifact runs on
    the torch backend, in the precision and on the device it was built for)."""
    import hotrod

    workers: dict[str, ModelWorker] = {}
    for name, directory in zip(served_names(dirs), dirs):
        precision = runtime.precision if runtime.backend == "torch" or "precision" in told else None
        chosen = {"backend": runtime.backend, "device": runtime.device, "precision": precision}
        model = hotrod.load(directory, threads=runtime.threads,
                            **{key: value if key in told else None for key, value in chosen.items()})
        workers[name] = ModelWorker(name, model, options, metrics, str(directory))
    return workers

