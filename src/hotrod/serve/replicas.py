"""What a replica of `hotrod serve` needs, as one plain value: built from the CLI or from a Serve config.

A Ray Serve deployment carries its replicas' arguments to every node, so they must be plain data that
pickles, checked before anything is deployed: a bad option is one line at the door, never a replica
that dies on a node far away. This module does not import ray, so the checks run (and are tested)
where ray is not installed.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotrod.errors import HotrodError, check_count, check_number
from hotrod.options import BACKENDS, DEVICES, ENGINE_PRECISIONS
from hotrod.runtime.base import RuntimeOptions
from hotrod.serve.limits import API_KEY_ENV, Access, ServeLimits
from hotrod.serve.worker import ServeOptions, served_names, told_choices


@dataclass(frozen=True)
class Scaling:
    """How many replicas: a fixed count, or autoscaling between `min_replicas` and `max_replicas` on the
    requests each replica holds (Ray Serve's ongoing requests; hotrod batches them, so the target is a
    batch's worth, not Ray's default of 2)."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        check_count("replicas", self.replicas)
        check_number("num_cpus", self.num_cpus, 0)
        check_number("num_gpus", self.num_gpus, 0)
        if self.autoscaling:
            low, high = self.min_replicas or 0, self.max_replicas or self.replicas
            check_count("max_replicas", high)
            if not 0 <= low <= high:
                raise HotrodError(f"min_replicas must be in 0..max_replicas ({high}), got {low}")
        if self.target_ongoing_requests is not None:
            check_number("target_ongoing_requests", self.target_ongoing_requests, 0, above=True)

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    def autoscaling_config(self, batch: int) -> dict[str, Any] | None:
        if not self.autoscaling:
            return None
        return {"min_replicas": self.min_replicas or 0, "initial_replicas": self.replicas,
                "max_replicas": self.max_replicas or self.replicas,
                "target_ongoing_requests": self.target_ongoing_requests or batch}


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything one replica needs to serve `artifacts` exactly as `hotrod serve` would on one machine.

    `artifacts` are paths each replica opens on its own node: absolute paths on storage every node sees,
    or paths relative to the replica's working directory (Ray's `working_dir`, which Ray uploads once
    to the cluster and each node downloads and caches when its first replica starts).
    """

    artifacts: tuple[str, ...]
    options: ServeOptions = field(default_factory=ServeOptions)
    limits: ServeLimits = field(default_factory=ServeLimits)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    access: Access = field(default_factory=Access)
    scaling: Scaling = field(default_factory=Scaling)
    # The fields of `runtime` the user chose (`hotrod.serve.worker.load_workers`); the others are left to
    # each artifact, as `hotrod serve` leaves them.
    told: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.artifacts:
            raise HotrodError("give at least one artifact directory")
        served_names(self.artifacts)

    @property
    def max_ongoing_requests(self) -> int:
        """Requests Ray may send one replica at once: its running batch and its queue, so that hotrod's own
        scheduler batches them and its queue bound (429) stays the one a client meets."""
        return self.options.max_batch_size + self.options.max_queue

    def replica_runtime(self) -> RuntimeOptions:
        """The runtime a replica runs: with threads unset, as many as the CPUs Ray reserved for it, so that
        replicas sharing a node do not each take every core."""
        if self.runtime.threads or not self.scaling.num_cpus:
            return self.runtime
        return dataclasses.replace(self.runtime, threads=max(1, round(self.scaling.num_cpus)))

    def local_artifacts(self) -> list[str]:
        """The artifacts as directories on this node, or one line saying which is missing where."""
        found = []
        for artifact in self.artifacts:
            path = Path(artifact).expanduser()
            if not (path / "manifest.json").is_file():
                raise HotrodError(f"artifact {artifact!r} is not on node {socket.gethostname()} (working "
                                  f"directory {os.getcwd()}): put artifacts on a path every node sees, or "
                                  "ship them with Ray's working_dir (`--ship`)")
            found.append(str(path.resolve()))
        return found


_SECTIONS = {"options": ServeOptions, "limits": ServeLimits, "scaling": Scaling}
_RUNTIME = {"backend": BACKENDS, "device": DEVICES, "engine_precision": ENGINE_PRECISIONS}


def spec_from_args(args: dict[str, Any]) -> ReplicaSpec:
    """A ReplicaSpec from a Serve config's `args` (flat keys named as the fields of ServeOptions, ServeLimits
    and Scaling, plus artifacts, backend, device, threads, engine_precision, api_key, cors_origins, docs).

    The API key may come from the replica's environment ($HOTROD_API_KEY, set through runtime_env) so it
    need not be written into the config.
    """
    if not isinstance(args, dict):
        raise HotrodError(f"the application's args must be a mapping, got {type(args).__name__}")
    args = dict(args)
    artifacts = args.pop("artifacts", None)
    if isinstance(artifacts, str):
        artifacts = [artifacts]
    if not isinstance(artifacts, list) or not all(isinstance(a, str) and a for a in artifacts):
        raise HotrodError("args.artifacts must be a list of artifact directories")
    sections = {name: _take(args, cls) for name, cls in _SECTIONS.items()}
    told = told_choices(args.get)
    runtime = _runtime(args)
    key = args.pop("api_key", None) or os.environ.get(API_KEY_ENV) or None
    access = Access(key, tuple(args.pop("cors_origins", ())), bool(args.pop("docs", False)))
    if args:
        known = sorted({f.name for cls in _SECTIONS.values() for f in dataclasses.fields(cls)}
                       | {"artifacts", "threads", "api_key", "cors_origins", "docs", *_RUNTIME})
        raise HotrodError(f"unknown argument {sorted(args)[0]!r}; known: {', '.join(known)}")
    return ReplicaSpec(tuple(artifacts), runtime=runtime, access=access, told=told, **sections)


def _take(args: dict[str, Any], cls: type) -> Any:
    try:
        return cls(**{f.name: args.pop(f.name) for f in dataclasses.fields(cls) if f.name in args})
    except TypeError as exc:
        raise HotrodError(f"bad argument: {exc}") from None


def _runtime(args: dict[str, Any]) -> RuntimeOptions:
    for name, choices in _RUNTIME.items():
        if name in args and args[name] is not None and args[name] not in choices:
            raise HotrodError(f"{name} must be one of {', '.join(choices)}, got {args[name]!r}")
    threads = args.pop("threads", 0)
    check_count("threads", threads, low=0)
    return RuntimeOptions(args.pop("backend", "onnxruntime"), args.pop("device", None) or "cpu", threads,
                          precision=args.pop("engine_precision", None) or "fp32")
