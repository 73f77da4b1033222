"""A peer run in a Python environment of its own, driven from the harness over a pipe.

Some peers pin other versions of libraries hotrod needs (optimum-intel pins an older transformers), so
they cannot be imported in hotrod's process. Such a peer is a worker script under
`hotrod/bench/workers/`, started with the other environment's Python; the harness times each `call`
from its own side, so a remote system's time includes one round trip over the pipe: a pickled token
tensor, or for encoders the hidden states (a few MB) or a head's logits, small against the calls timed.
"""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

WORKERS = Path(__file__).parent / "workers"


class RemoteError(RuntimeError):
    """A worker's failure, with its one-line reason."""


class Worker:
    """One worker process: `build` once, then `call` as often as the harness times it, then `close`."""

    def __init__(self, python: str, script: str | Path, log: Path):
        """Starts `script` (a file of `hotrod/bench/workers/`, or a path) under `python`; its output goes to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")  # the worker's own output, kept for a failure's details
        # -I: the other environment sees neither this process's PYTHONPATH nor its user site.
        self._process = subprocess.Popen([python, "-I", str(WORKERS / script)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log)

    def request(self, op: str, **fields) -> dict:
        try:
            pickle.dump({"op": op, **fields}, self._process.stdin)
            self._process.stdin.flush()
            reply = pickle.load(self._process.stdout)
        except (BrokenPipeError, EOFError, pickle.UnpicklingError) as exc:
            code = self._process.wait()
            raise RemoteError(f"the worker exited with code {code} (its output: {self._log.name})") from exc
        if not reply["ok"]:
            raise RemoteError(reply["error"])
        return reply

    def build(self, **args) -> dict:
        return self.request("build", args=args)

    def call(self, first: bool = False) -> torch.Tensor:
        return _tensor(self.request("call", first=first)["value"])

    def outputs(self) -> SimpleNamespace:
        """A call whose reply is a model's named outputs (a head's logits), as transformers' output gives
        them: one tensor attribute per name."""
        value = self.request("call", first=False)["value"]
        return SimpleNamespace(**{name: _tensor(array) for name, array in value.items()})

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                pickle.dump({"op": "close"}, self._process.stdin)
                self._process.stdin.close()
                self._process.wait(timeout=30)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        self._log.close()


def _tensor(value) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(value))


def has_module(python: str, module: str) -> bool:
    """Whether `module` imports under `python` (found without importing it, so this stays cheap)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-I", "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def environment_problem(variable: str, found: str | None, module: str, why: str, install: str) -> str | None:
    """Why a peer's own environment cannot run it, or None: `found` is the Python named in `variable` (or
    this one), `why` says why the peer needs an environment of its own, `install` what to install there."""
    if found is None:
        return (f"not installed: {why}, so it needs an environment of its own; `make peers` builds one, "
                f"then set {variable} to its Python")
    if not os.path.isfile(found):
        return f"{variable}={found} is not a file"
    if not has_module(found, module):
        return f"{variable}={found} cannot import {module} ({install} there)"
    return None
