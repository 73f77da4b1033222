"""`hotrod serve ... --ray ADDRESS`: deploy onto a Ray cluster and stay in the foreground until a signal.

The process is Ray's driver: it joins the cluster (or, with `--ray auto` and no cluster running, starts
one on this machine), starts Ray Serve's HTTP proxies on `--host/--port`, deploys the replicas and waits
until they all serve. On SIGTERM or SIGINT it deletes the application, which lets each replica finish
the requests it holds (within the shutdown timeout) before Ray stops it, and only then exits. A cluster
it started itself ends with it; a cluster it joined keeps running, without hotrod.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hotrod.errors import HotrodError, first_line
from hotrod.serve.replicas import ReplicaSpec

APP_NAME = "hotrod"
# Ray's proxy ends a request this long after hotrod's own timeout would have (408): only a request lost
# with a replica that died under it ever waits that long.
PROXY_MARGIN_S = 10.0
WATCH_S = 2.0  # how often the driver checks the application while it waits for a signal
log = logging.getLogger("hotrod.serve")


def serve_on_ray(spec: ReplicaSpec, address: str, host: str, port: int, ship: bool = False) -> None:
    """Deploy `spec` on the cluster at `address` and serve on host:port until SIGTERM or SIGINT."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise HotrodError("--ray needs Ray Serve: pip install 'hotrod[ray]'") from None
    from hotrod.serve.ray import deployment

    with _shipped(spec, ship) as (spec, runtime_env):
        _connect(ray, address, runtime_env)
        stop = _stop_on_signals()
        ours = _start_serve(serve, host, port, spec.limits.request_timeout_s + PROXY_MARGIN_S)
        try:
            serve.run(deployment(spec), name=APP_NAME, route_prefix="/")
        except Exception as exc:  # a replica that cannot start: Ray says why in its first line
            _delete(serve)
            raise HotrodError(f"the deployment failed: {first_line(exc)}") from None
        replicas = spec.scaling.replicas
        print(f"hotrod: serving {', '.join(Path(a).name for a in spec.artifacts)} on http://{host}:{port} "
              f"through Ray Serve ({replicas} replica{'s' if replicas != 1 else ''}); SIGTERM or Ctrl-C to stop",
              file=sys.stderr, flush=True)
        failure = _wait(serve, stop)
        _delete(serve)
        if ours:  # leave the cluster as found: the next deployment may want another host or port
            serve.shutdown()
    if failure:
        raise HotrodError(failure)


def _connect(ray: Any, address: str, runtime_env: dict[str, Any] | None) -> None:
    """Join the cluster at `address`; `auto` joins the one running on this machine or starts one.

    A shipped working_dir is the driver's (Ray uploads local folders only for a driver), and the
    replicas it deploys inherit it."""
    init = functools.partial(ray.init, logging_level=logging.WARNING, runtime_env=runtime_env)
    try:
        if address == "auto":
            try:
                init(address="auto")
            except ConnectionError:
                init()
        else:
            init(address=address)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise HotrodError(f"cannot join the Ray cluster at {address}: {first_line(exc)}") from None


def _start_serve(serve: Any, host: str, port: int, timeout_s: float) -> bool:
    """Start Ray Serve's proxies on host:port; True if this call started Serve on the cluster.

    A cluster has one set of HTTP options, fixed when Serve first starts on it: when Serve already runs
    there on another host or port, deploying would not serve where asked, so that is refused."""
    from ray.serve.context import _get_global_client

    running = _get_global_client(raise_if_no_controller_running=False)
    if running is not None:
        config = running.http_config
        if (config.host, config.port) != (host, port):
            raise HotrodError(f"Ray Serve already runs on this cluster at {config.host}:{config.port}; serve there "
                              f"(--host {config.host} --port {config.port}) or stop it first (`serve shutdown`)")
    serve.start(http_options={"host": host, "port": port, "request_timeout_s": timeout_s})
    return running is None


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _wait(serve: Any, stop: threading.Event) -> str | None:
    """Wait for a signal; a failed application (Ray gave up restarting it) ends the wait with why."""
    while not stop.wait(WATCH_S):
        status = serve.status().applications.get(APP_NAME)
        if status is None:
            return "the application was deleted from the cluster"
        if str(status.status).endswith("DEPLOY_FAILED"):
            return f"the application failed: {first_line(Exception(status.message))}"
    return None


def _delete(serve: Any) -> None:
    """Delete the application: Ray stops taking requests for it and each replica drains before it stops."""
    try:
        serve.delete(APP_NAME)
    except Exception as exc:  # noqa: BLE001  (the cluster may be gone already: nothing is left to stop)
        log.warning("could not delete the application: %s", first_line(exc))


@contextmanager
def _shipped(spec: ReplicaSpec, ship: bool) -> Iterator[tuple[ReplicaSpec, dict[str, Any] | None]]:
    """With `ship`, the artifacts go to the cluster as Ray's working_dir: a folder of links to them,
    which Ray zips and uploads once to the cluster's store; each node downloads and unpacks it when its
    first replica starts, and the replicas open the artifacts by name in it."""
    if not ship:
        yield spec, None
        return
    with tempfile.TemporaryDirectory(prefix="hotrod-ship-") as staging:
        for artifact in spec.artifacts:
            source = Path(artifact).expanduser().resolve()
            if not (source / "manifest.json").is_file():
                raise HotrodError(f"{artifact} is not an artifact directory (no manifest.json)")
            os.symlink(source, Path(staging) / source.name, target_is_directory=True)
        names = tuple(Path(a).expanduser().resolve().name for a in spec.artifacts)
        yield dataclasses.replace(spec, artifacts=names), {"working_dir": staging}
