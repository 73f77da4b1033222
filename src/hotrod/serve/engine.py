"""A served model: its tokenizer, scheduler and runner, driven by one worker thread.

The app submits requests from the event loop; the worker thread owns the model and runs the loop
plan -> run -> report. Events go back to each request's ticket as they happen (a streaming client sees
each token the step it is produced). An exception while running a batch fails that batch's requests
only; the worker carries on with the next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hotrod.errors import HotrodError, first_line
from hotrod.model import HotrodModel
from hotrod.runtime.base import RuntimeOptions
from hotrod.serve.metrics import Metrics
from hotrod.serve.protocol import BatchFailed, Event, ModelInfo, Params, ShuttingDown, Ticket
from hotrod.serve.runner import EncoderRunner, GenerationRunner, position_bytes
from hotrod.serve.scheduler import POLICIES, ContinuousScheduler, DynamicBatcher, Request


@dataclass(frozen=True)
class ServeOptions:
    """How each model is scheduled. `kv_cache_mb` bounds the running batch's cache (padded positions)."""

    max_batch_size: int = 32
    max_queue_delay_ms: float = 5.0
    max_queue: int = 256
    kv_cache_mb: float = 1024.0
    batching: str = "continuous"  # continuous | request | none (generation)

    def __post_init__(self):
        for name in ("max_batch_size", "max_queue"):
            if getattr(self, name) < 1:
                raise HotrodError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_queue_delay_ms", "kv_cache_mb"):
            if not getattr(self, name) >= 0:
                raise HotrodError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.batching not in POLICIES:
            raise HotrodError(f"unknown batching {self.batching!r}; choose from {', '.join(POLICIES)}")


class ModelEngine:
    def __init__(self, name: str, model: HotrodModel, options: ServeOptions, metrics: Metrics | None = None,
                 path: str = ""):
        self.model = model
        self.options = options
        self.metrics = metrics or Metrics()
        dims = model.dims
        self.info = ModelInfo(name, model.kind, model.config.vocab_size, dims.max_positions, int(time.time()), path)
        self._cond = threading.Condition()
        self._accepting = True
        self._ready = False
        self._stop = False
        self._thread: threading.Thread | None = None
        if model.kind == "encoder":
            self.runner = EncoderRunner(model)
            self.scheduler = DynamicBatcher(options.max_batch_size, options.max_queue_delay_ms / 1000,
                                            options.max_queue)
        else:
            self.runner = GenerationRunner(model)
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

    # -- submission (event loop) --------------------------------------------------------------------

    def submit_generate(self, prompt: list[int], params: Params) -> Ticket:
        options = self.runner.options(prompt, params)  # HotrodError for a bad combination: the app's 400
        return self._submit(Request(Ticket(), prompt=list(prompt), params=params, options=options))

    def submit_embed(self, rows: list[list[int]], pooling: str, normalize: bool) -> Ticket:
        return self._submit(Request(Ticket(), rows=[list(r) for r in rows], options=(pooling, normalize)))

    def _submit(self, request: Request) -> Ticket:
        request.ticket.submitted = request.arrived
        with self._cond:
            if not self._accepting:
                raise ShuttingDown()
            self.scheduler.add(request)  # QueueFull past the bound
            self._cond.notify()
        return request.ticket

    def queue_depth(self) -> int:
        return len(self.scheduler.waiting)

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Warm up (the first runs build kernels and buffers), then start the worker."""
        self._warm_up()
        self._thread = threading.Thread(target=self._loop, name=f"hotrod-{self.info.name}", daemon=True)
        self._thread.start()
        self._ready = True

    def ready(self) -> bool:
        return self._ready and not self._stop

    def stop(self, drain: bool = True) -> None:
        with self._cond:
            self._accepting = False
            if not drain:
                for request in self._abandon():
                    if not request.ticket.done:
                        request.ticket.push(Event(error=ShuttingDown()))
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        self._ready = False

    def _warm_up(self) -> None:
        if self.model.kind == "encoder":
            self.model.embed([[1, 2, 3]])
        else:
            self.model.generate([[1, 2, 3]], max_new_tokens=2)

    def _abandon(self) -> list[Request]:
        waiting = list(self.scheduler.waiting)
        self.scheduler.waiting.clear()
        running = self.scheduler.fail_running() if isinstance(self.scheduler, ContinuousScheduler) else []
        return waiting + running

    # -- the worker ------------------------------------------------------------------------------------

    def _loop(self) -> None:
        loop = self._generation_iteration if self.model.kind != "encoder" else self._encoder_iteration
        while True:
            with self._cond:
                while not self.scheduler.busy() and not self._stop:
                    self._cond.wait()
                if self._stop and not self.scheduler.busy():
                    return
            loop()

    def _generation_iteration(self) -> None:
        scheduler, runner = self.scheduler, self.runner
        with self._cond:
            plan = scheduler.plan()
        runner.leave(plan.cancelled)
        for request in plan.cancelled:
            request.ticket.push(Event(finish_reason="cancelled"))
        if plan.whole is not None:
            self._run_whole(plan.whole)
        running = list(runner.rows)
        if running:
            self._guard(running, lambda: self._record(running, runner.step()), self._drop(running, reset=True))
        if plan.admit:
            for request in plan.admit:
                self._started(request)
            self._guard(plan.admit, lambda: self._record(plan.admit, runner.admit(plan.admit)),
                        self._drop(plan.admit, reset=False))
        self._report_queue()

    def _record(self, requests: list[Request], tokens: list[int]) -> None:
        self.metrics.batch(self.info.name, self.info.kind, len(requests))
        done = []
        for request, token in zip(requests, tokens):
            before = len(request.tokens)
            finished = self.scheduler.record(request, token)
            fresh = request.tokens[before:]
            self.metrics.tokens(self.info.name, len(fresh))
            if finished:
                done.append(request)
                request.ticket.push(Event(tokens=fresh, finish_reason=request.finish_reason))
            elif fresh:
                request.ticket.push(Event(tokens=fresh))
        with self._cond:
            self.scheduler.leave(done)
        self.runner.leave(done)

    def _guard(self, requests: list[Request], work: Callable[[], None], cleanup: Callable[[], None]) -> None:
        """Run `work`; if it raises, `cleanup` and fail exactly `requests`: the other requests go on."""
        try:
            work()
        except Exception as exc:  # noqa: BLE001  (any fault of one batch must not stop the server)
            error = BatchFailed(f"running the batch failed: {first_line(exc)}")
            cleanup()
            for request in requests:
                request.ticket.push(Event(error=error))

    def _drop(self, requests: list[Request], reset: bool) -> Callable[[], None]:
        """Cleanup after a failed generation batch: its rows leave the scheduler and the runner."""
        def cleanup():
            with self._cond:
                self.scheduler.leave(requests)
            if reset:  # a failed step leaves the running cache in an unknown state
                self.runner.reset()
            else:
                self.runner.leave(requests)
        return cleanup

    def _run_whole(self, request: Request) -> None:
        self._started(request)

        def work():
            # The scheduler's own record() ends the request at its first EOS, as in a batch; what follows
            # in generate()'s output is padding.
            for token in self.runner.run_whole(request):
                if self.scheduler.record(request, token):
                    break
            self.metrics.batch(self.info.name, self.info.kind, 1)
            self.metrics.tokens(self.info.name, len(request.tokens))
            request.ticket.push(Event(tokens=request.tokens, finish_reason=request.finish_reason or "length"))

        self._guard([request], work, self._drop([request], reset=False))

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

        def work():
            for request, vectors in zip(batch, self.runner.embed(batch)):
                request.ticket.push(Event(finish_reason="stop", result=vectors))

        self._guard(batch, work, lambda: None)
        self._report_queue()

    def _started(self, request: Request) -> None:
        request.started = request.ticket.started = time.perf_counter()
        self.metrics.queue_wait(self.info.name, request.started - request.arrived)

    def _report_queue(self) -> None:
        running = len(getattr(self.scheduler, "running", []))
        self.metrics.queue(self.info.name, len(self.scheduler.waiting), running)


def load_engines(dirs: list[str], options: ServeOptions, runtime: RuntimeOptions,
                 metrics: Metrics) -> dict[str, ModelEngine]:
    """One engine per artifact directory, named after the directory; names must be unique."""
    import hotrod

    engines: dict[str, ModelEngine] = {}
    for directory in dirs:
        name = Path(directory).resolve().name
        if name in engines:
            raise HotrodError(f"two models would both be served as {name!r}; serve them from differently named folders")
        model = hotrod.load(directory, backend=runtime.backend, device=runtime.device, threads=runtime.threads,
                            precision=runtime.precision if runtime.backend == "torch" else None)
        engines[name] = ModelEngine(name, model, options, metrics, str(directory))
    return engines

