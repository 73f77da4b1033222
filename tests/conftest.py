"""Session fixtures: the zoo of tiny checkpoints and artifacts, and an isolated, offline environment.

`pytest_generate_tests` parametrizes any test that asks for `case` (every entry of the table),
`lm_case` (decoder-only and seq2seq), `seq2seq_case`, `encoder_case`, `head_case` (every encoder case
with every task head) or `backend` (every backend), so that adding a row to `tests.zoo.CASES` runs the
whole suite on it.
"""

from __future__ import annotations

import huggingface_hub.constants
import pytest
import torch

from tests.zoo import BACKENDS, CASES, ENCODER_CASES, HEAD_CASES, LM_CASES, SEQ2SEQ_CASES, Zoo

_PARAMETERS = {
    "case": list(CASES),
    "lm_case": LM_CASES,
    "seq2seq_case": SEQ2SEQ_CASES,
    "encoder_case": ENCODER_CASES,
    "head_case": list(HEAD_CASES),
    "backend": list(BACKENDS),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name, values in _PARAMETERS.items():
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, values)


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch, tmp_path_factory):
    """Exports of checkpoints go to a private cache, and nothing ever waits on the (unreachable) hub."""
    monkeypatch.setenv("HOTROD_CACHE", str(tmp_path_factory.mktemp("hotrod-cache")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable at import time; this is the flag its requests consult.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    threads = torch.get_num_threads()  # loading on the torch backend sets the process-wide count
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fill_disk(monkeypatch):
    """Calling it makes `optimize` run out of disk space part way (as it writes the configs, after the graphs)."""
    import errno
    import os

    import hotrod.build.graphs

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return lambda: monkeypatch.setattr(hotrod.build.graphs, "write_configs", full)
