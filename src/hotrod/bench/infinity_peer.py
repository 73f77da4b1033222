"""Infinity (`infinity-emb`) as a reranking peer (W7), in a Python environment of its own.

infinity-emb pins sentence-transformers 3, and with it transformers 4, older than hotrod's; installed beside
hotrod it would downgrade hotrod's own transformers. `make peers` builds it an environment of its own: the
harness finds that environment's Python in `HOTROD_INFINITY_PYTHON`, or uses its own where infinity-emb
imports beside hotrod, and drives `workers/infinity_worker.py` there with the case's text.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

from hotrod.bench.case import Case
from hotrod.bench.remote import Worker, environment_problem
from hotrod.bench.runners import System, dir_size
from hotrod.source import cache_dir

ENVIRONMENT = "HOTROD_INFINITY_PYTHON"


def python() -> str | None:
    """The Python that runs Infinity: `HOTROD_INFINITY_PYTHON`, or this one where infinity-emb is here."""
    named = os.environ.get(ENVIRONMENT)
    if named:
        return named
    return sys.executable if importlib.util.find_spec("infinity_emb") else None


def problem(device: str) -> str | None:
    """Why Infinity cannot be timed here, or None."""
    if device != "cpu":
        return "Infinity is timed on the CPU only in this bench (its environment has the CPU build of torch)"
    return environment_problem(ENVIRONMENT, python(), "infinity_emb", "infinity-emb pins transformers 4",
                               "pip install 'infinity-emb[torch]'")


def system(case: Case, ids: torch.Tensor, mask: torch.Tensor, threads: int) -> System:
    """Infinity's engine reranking the case's documents for its query, timed from this side of the pipe."""
    from hotrod.bench.vocab import texts

    query, documents = texts(ids, mask, case.query)
    worker = Worker(python(), "infinity_worker.py", cache_dir() / "bench" / "infinity" / "worker.log")
    try:
        info = worker.build(source=case.source, query=query, documents=documents, threads=threads)
    except BaseException:
        worker.close()
        raise
    return System(worker.call, None, "fp32", dir_size(Path(case.source)),
                  figures={"version": info["version"]}, close=worker.close)
