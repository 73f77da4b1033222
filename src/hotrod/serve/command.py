"""`hotrod serve`: its options, and the thin step from them to `serve()`.

Every option is checked by the dataclass it fills (ServeOptions, ServeLimits, Access) before any model
is loaded, so a bad value is one line, never a traceback or a worker that dies later.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from hotrod.errors import HotrodError
from hotrod.serve.limits import API_KEY_ENV
from hotrod.serve.scheduler import POLICIES


def add_serve_parser(sub, runtime_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("serve", help="serve artifacts over HTTP with dynamic and continuous batching")
    p.add_argument("models", nargs="+", metavar="DIR", help="artifact directories; each is served by its folder name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-size", type=int, default=32, help="rows per batch (generation: running requests)")
    p.add_argument("--max-queue-delay-ms", type=float, default=5.0, help="longest an encoder request waits for a batch")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests per model before 429")
    p.add_argument("--max-new-tokens-limit", type=int, default=256)
    p.add_argument("--max-input-tokens", type=int, default=None,
                   help="longest prompt or embedding input (default: the model's positions, or 512 for T5)")
    p.add_argument("--max-batch-inputs", type=int, default=256,
                   help="inputs per embedding or classification request, documents per rerank, and rows per "
                        "/v2 infer request")
    p.add_argument("--max-request-bytes", type=int, default=4 * 2**20, help="largest request body (413 above)")
    p.add_argument("--max-connections", type=int, default=1024, help="open connections before 503")
    p.add_argument("--request-timeout", type=float, default=60.0, help="seconds before a request ends with 504")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds to let requests in flight finish after SIGTERM")
    p.add_argument("--kv-cache-mb", type=float, default=1024.0, help="KV-cache budget of a running batch")
    p.add_argument("--batching", default="continuous", choices=POLICIES,
                   help="generation: continuous (iteration-level), request (request-level) or none")
    p.add_argument("--speculate", default=None, metavar="prompt-lookup:N",
                   help="speculative decoding for generation requests that do not say (their `speculate` field): "
                        "draft up to N tokens (0 to 64) a step from each request's own text, verified in one pass")
    p.add_argument("--api-key", default=None,
                   help=f"require `Authorization: Bearer KEY` on every /v1 and /v2 route but the health probes "
                        f"(default: ${API_KEY_ENV})")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browsers on ORIGIN call the server (repeatable; default: none)")
    p.add_argument("--docs", action="store_true", help="serve the interactive API docs at /docs")
    ray = p.add_argument_group("on a Ray cluster (pip install 'hotrod[ray]')")
    ray.add_argument("--ray", default=None, metavar="ADDRESS",
                     help="deploy on the Ray cluster at ADDRESS (host:port of its head, or `auto`: the one on "
                          "this machine, started if none runs) and serve through Ray Serve's proxies")
    ray.add_argument("--replicas", type=int, default=None, help="replicas (each a whole server on one node; "
                                                                   "default 1)")
    ray.add_argument("--min-replicas", type=int, default=None, help="autoscale down to this many replicas")
    ray.add_argument("--max-replicas", type=int, default=None, help="autoscale up to this many replicas")
    ray.add_argument("--num-cpus", type=float, default=None, help="CPUs Ray reserves for each replica (default 1)")
    ray.add_argument("--num-gpus", type=float, default=None, help="GPUs Ray reserves for each replica (default 0)")
    ray.add_argument("--ship", action="store_true",
                     help="send the artifacts to the cluster (Ray's working_dir) instead of reading them from "
                          "a path every node sees")
    runtime_args(p)
    p.set_defaults(handler=run_serve)


def run_serve(args) -> int:
    from hotrod.runtime.base import RuntimeOptions
    from hotrod.serve.app import StartupFailed, serve
    from hotrod.serve.limits import Access, ServeLimits
    from hotrod.serve.metrics import Metrics
    from hotrod.serve.worker import ServeOptions, load_workers, told_choices

    options = ServeOptions(args.max_batch_size, args.max_queue_delay_ms, args.max_queue, args.kv_cache_mb,
                           args.batching, speculation(args.speculate))
    limits = ServeLimits(args.max_new_tokens_limit, args.request_timeout, args.max_input_tokens,
                         args.max_batch_inputs, args.max_request_bytes, args.max_connections, args.shutdown_timeout)
    access = Access(args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None,
                    tuple(args.cors_origin), args.docs)
    if not 0 <= args.port < 65536:
        raise HotrodError(f"--port must be in 0..65535, got {args.port}")
    runtime = RuntimeOptions(args.backend or "onnxruntime", args.device or "cpu", args.threads,
                             precision=args.engine_precision or "fp32")
    if args.ray is not None:  # Ray's proxies listen, on every node: there is no one socket to try here
        return _run_on_ray(args, options, limits, access, runtime)
    told = [flag for flag in RAY_FLAGS if (value := vars(args)[flag[2:].replace("-", "_")]) is not None
            and value is not False]  # 0 is given (0 == False, but not False itself)
    if told:
        raise HotrodError(f"{told[0]} applies to a deployment on Ray: add --ray ADDRESS")
    _check_listen(args.host, args.port)
    metrics = Metrics()
    workers = load_workers(args.models, options, runtime, metrics, told_choices(vars(args).get))
    try:
        serve(workers, limits, args.host, args.port, metrics, access=access)
    except StartupFailed as exc:
        raise HotrodError(str(exc)) from None
    return 0


SPECULATORS = ("prompt-lookup",)


def speculation(value: str | None) -> int:
    """The tokens `--speculate prompt-lookup:N` drafts a step (0 without the option); a bad value is one line."""
    if value is None:
        return 0
    method, _, count = value.partition(":")
    if method not in SPECULATORS:
        raise HotrodError(f"--speculate: unknown method {method!r}; choose from {', '.join(SPECULATORS)} "
                          f"(as prompt-lookup:N)")
    from hotrod.generation.drafts import MAX_DRAFT_TOKENS

    if not count.strip().isdigit() or int(count) > MAX_DRAFT_TOKENS:
        raise HotrodError(f"--speculate: {method} takes a token count from 0 to {MAX_DRAFT_TOKENS}, as "
                          f"{method}:4; got {value!r}")
    return int(count)


# The options only a deployment on Ray reads (its replicas and what Ray reserves for each).
RAY_FLAGS = ("--replicas", "--min-replicas", "--max-replicas", "--num-cpus", "--num-gpus", "--ship")


def _run_on_ray(args, options, limits, access, runtime) -> int:
    from hotrod.serve.on_ray import serve_on_ray
    from hotrod.serve.replicas import ReplicaSpec, Scaling
    from hotrod.serve.worker import told_choices

    given = {name: value for name, value in (("replicas", args.replicas), ("num_cpus", args.num_cpus),
                                             ("num_gpus", args.num_gpus)) if value is not None}
    scaling = Scaling(min_replicas=args.min_replicas, max_replicas=args.max_replicas, **given)
    artifacts = tuple(str(Path(model).expanduser().resolve()) for model in args.models)
    spec = ReplicaSpec(artifacts, options, limits, runtime, access, scaling, told=told_choices(vars(args).get))
    serve_on_ray(spec, args.ray, args.host, args.port, ship=args.ship)
    return 0


def _check_listen(host: str, port: int) -> None:
    """Refuse a host or port the server could not listen on before any model is loaded."""
    import socket

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise HotrodError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
