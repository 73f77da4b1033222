"""hotrod on Ray Serve: each replica is a whole `hotrod serve` (its workers, batching and HTTP API) on one
node, and Ray runs as many as asked, routes requests to them, restarts the ones that die, and scales.

A Serve config deploys it with the application builder `app`:

    applications:
      - name: hotrod
        import_path: hotrod.serve.ray:app
        args: {artifacts: [/shared/gpt2-int4], replicas: 2, num_cpus: 2}

Artifacts are opened on each replica's node: from a path every node sees, or relative to the replica's
working directory, which a Serve config may set to a remote archive (`runtime_env: {working_dir:
"s3://bucket/artifacts.zip"}`) that each node downloads and caches once. `hotrod serve --ship` uploads
local artifacts the same way, through the driver.

Nothing here knows a model: a replica loads its artifacts with `load_workers` and serves them with
`create_app`, the same two calls `hotrod serve` makes, so the endpoints (hotrod's, OpenAI's, the Open
Inference Protocol) are the same on one machine and on a cluster. Ray's HTTP proxy on each node sends
each request to a replica; hotrod's scheduler in that replica batches what it gets.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from prometheus_client import Gauge
from ray import serve
from ray.serve import metrics as ray_metrics
from ray.serve.deployment import Application

from hotrod.serve.app import create_app
from hotrod.serve.metrics import _RECORD, SPECS, Metrics, Spec
from hotrod.serve.replicas import ReplicaSpec, spec_from_args
from hotrod.serve.worker import ModelWorker, load_workers

DEPLOYMENT = "hotrod"
HEALTH_CHECK_PERIOD_S = 5.0


class RayMetrics(Metrics):
    """hotrod's metrics, recorded twice: in the replica's own registry (its /metrics) and in Ray's
    metrics, which Ray tags with the deployment and replica and exports from every node's metrics port,
    so that one Prometheus scrape of the cluster sums the replicas. Both are built from `SPECS`."""

    def __init__(self):
        super().__init__()
        # This replica's /metrics answers for itself alone (Ray's proxy picks the replica): it says which.
        replica = serve.get_replica_context().replica_id.unique_id
        Gauge("hotrod_replica_info", "The Ray Serve replica answering", ["replica"], registry=self.registry) \
            .labels(replica).set(1)
        self.mirror = {key: _ray_metric(spec) for key, spec in SPECS.items()}

    def record(self, key: str, labels: tuple[str, ...], value: float) -> None:
        super().record(key, labels, value)
        spec = SPECS[key]
        if spec.type == "counter" and not value:  # Ray's counters refuse an increment of 0
            return
        getattr(self.mirror[key], _RECORD[spec.type])(value, dict(zip(spec.labels, labels)))


def _ray_metric(spec: Spec):
    if spec.type == "histogram":
        return ray_metrics.Histogram(spec.name, spec.help, list(spec.buckets), spec.labels)
    return {"gauge": ray_metrics.Gauge, "counter": ray_metrics.Counter}[spec.type](spec.name, spec.help, spec.labels)


class HotrodReplica:
    """One replica: loads and warms its workers in the constructor (Ray counts it as started only once
    they serve), then hands Ray the same app `hotrod serve` runs. Its lifespan drains the workers when
    Ray stops the replica, after Ray's own wait for the requests in flight."""

    def __init__(self, spec: ReplicaSpec):
        self.spec = spec
        self.metrics = RayMetrics()
        self.workers: dict[str, ModelWorker] = load_workers(spec.local_artifacts(), spec.options,
                                                            spec.replica_runtime(), self.metrics, spec.told)
        for worker in self.workers.values():
            worker.start()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self.workers, self.spec.limits, self.metrics, self.spec.access)

    def check_health(self) -> None:
        """Ray's health check: a model whose worker died fails it, and Ray replaces the replica."""
        for name, worker in self.workers.items():
            if worker.failure():
                raise RuntimeError(f"model {name} stopped working: {worker.failure()}")


Replica = serve.deployment(name=DEPLOYMENT)(serve.ingress()(HotrodReplica))


def deployment(spec: ReplicaSpec) -> Application:
    """The Serve application for `spec`: its replica count or autoscaling bounds, each replica's CPUs and
    GPUs, and Ray's limits set from hotrod's own (in flight per replica, graceful shutdown)."""
    scaling = spec.scaling
    actor = {"num_cpus": scaling.num_cpus, "num_gpus": scaling.num_gpus}
    options: dict[str, Any] = {
        "ray_actor_options": actor, "max_ongoing_requests": spec.max_ongoing_requests,
        "graceful_shutdown_timeout_s": spec.limits.shutdown_timeout_s,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    }
    autoscaling = scaling.autoscaling_config(spec.options.max_batch_size)
    if autoscaling:
        options["autoscaling_config"] = autoscaling
    else:
        options["num_replicas"] = scaling.replicas
    return Replica.options(**options).bind(spec)


def app(args: dict[str, Any]) -> Application:
    """The application builder a Serve config names (`import_path: hotrod.serve.ray:app`)."""
    return deployment(spec_from_args(args))
