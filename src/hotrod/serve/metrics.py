"""The server's Prometheus metrics, on a registry of its own so that two servers in one process don't mix.

The engines record what the scheduler does (queue depth, batch sizes, queue wait, tokens); the app
records what clients see (request latency and outcome).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.depth = Gauge("hotrod_queue_depth", "Requests waiting to run", ["model"], registry=r)
        self.running = Gauge("hotrod_running_requests", "Requests in the running batch", ["model"], registry=r)
        self.batch_size = Histogram("hotrod_batch_size", "Rows per model call (generation: per decoding step)",
                                    ["model", "kind"], buckets=_BATCH_BUCKETS, registry=r)
        self.wait = Histogram("hotrod_queue_wait_seconds", "Time from arrival to first run", ["model"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("hotrod_request_latency_seconds", "Time from arrival to the last byte",
                                 ["model", "endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.generated = Counter("hotrod_generated_tokens", "Tokens generated", ["model"], registry=r)
        self.requests = Counter("hotrod_requests", "Requests by outcome", ["model", "endpoint", "outcome"],
                                registry=r)

    def queue(self, model: str, waiting: int, running: int) -> None:
        self.depth.labels(model).set(waiting)
        self.running.labels(model).set(running)

    def batch(self, model: str, kind: str, size: int) -> None:
        self.batch_size.labels(model, kind).observe(size)

    def queue_wait(self, model: str, seconds: float) -> None:
        self.wait.labels(model).observe(seconds)

    def tokens(self, model: str, count: int) -> None:
        self.generated.labels(model).inc(count)

    def request(self, model: str, endpoint: str, outcome: str, seconds: float | None = None) -> None:
        """`outcome`: ok, cancelled, timeout, rejected (429), invalid (4xx), failed (500), unavailable (503)."""
        self.requests.labels(model, endpoint, outcome).inc()
        if seconds is not None:
            self.latency.labels(model, endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
