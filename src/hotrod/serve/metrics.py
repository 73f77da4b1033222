"""The server's Prometheus metrics, on a registry of its own so that two servers in one process don't mix.

The workers record what the scheduler does (queue depth, batch sizes, queue wait, tokens); the app
records what clients see (request latency and outcome).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Spec:
    """One metric, declared once: the registry here and a mirror elsewhere (Ray's) are built from it."""

    type: str  # gauge | histogram | counter
    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


SPECS = {
    "depth": Spec("gauge", "hotrod_queue_depth", "Requests waiting to run", ("model",)),
    "running": Spec("gauge", "hotrod_running_requests", "Requests in the running batch", ("model",)),
    "batch_size": Spec("histogram", "hotrod_batch_size", "Rows per model call (generation: per decoding step)",
                       ("model", "kind"), _BATCH_BUCKETS),
    "wait": Spec("histogram", "hotrod_queue_wait_seconds", "Time from arrival to first run", ("model",),
                 _LATENCY_BUCKETS),
    "latency": Spec("histogram", "hotrod_request_latency_seconds", "Time from arrival to the last byte",
                    ("model", "endpoint"), _LATENCY_BUCKETS),
    "generated": Spec("counter", "hotrod_generated_tokens", "Tokens generated", ("model",)),
    "drafted": Spec("counter", "hotrod_draft_tokens", "Tokens drafted by speculative decoding (prompt lookup)",
                    ("model",)),
    "accepted": Spec("counter", "hotrod_accepted_draft_tokens", "Drafted tokens the model verified and kept",
                     ("model",)),
    "requests": Spec("counter", "hotrod_requests", "Requests by outcome", ("model", "endpoint", "outcome")),
}

_RECORD = {"gauge": "set", "histogram": "observe", "counter": "inc"}  # each type's way of taking a value


def _prometheus(spec: Spec, registry: CollectorRegistry):
    if spec.type == "histogram":
        return Histogram(spec.name, spec.help, list(spec.labels), buckets=spec.buckets, registry=registry)
    return {"gauge": Gauge, "counter": Counter}[spec.type](spec.name, spec.help, list(spec.labels), registry=registry)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        for key, spec in SPECS.items():
            setattr(self, key, _prometheus(spec, self.registry))

    def queue(self, model: str, waiting: int, running: int) -> None:
        self.record("depth", (model,), waiting)
        self.record("running", (model,), running)

    def batch(self, model: str, kind: str, size: int) -> None:
        self.record("batch_size", (model, kind), size)

    def queue_wait(self, model: str, seconds: float) -> None:
        self.record("wait", (model,), seconds)

    def tokens(self, model: str, count: int) -> None:
        self.record("generated", (model,), count)

    def drafts(self, model: str, drafted: int, accepted: int) -> None:
        """Tokens speculative decoding drafted in one step, and those the model kept."""
        self.record("drafted", (model,), drafted)
        self.record("accepted", (model,), accepted)

    def request(self, model: str, endpoint: str, outcome: str, seconds: float | None = None) -> None:
        """`outcome`: ok, cancelled, timeout, rejected (429), invalid (4xx), failed (500), unavailable (503)."""
        self.record("requests", (model, endpoint, outcome), 1)
        if seconds is not None:
            self.record("latency", (model, endpoint), seconds)

    def record(self, key: str, labels: tuple[str, ...], value: float) -> None:
        """The one place a value is recorded: a gauge is set, a histogram observes, a counter adds."""
        getattr(getattr(self, key).labels(*labels), _RECORD[SPECS[key].type])(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
