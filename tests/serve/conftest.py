"""Started workers, stopped after each test: fake ones of each kind for the tests of the HTTP layer."""

from __future__ import annotations

from typing import TypeVar

import pytest

from hotrod.serve.messages import Worker
from tests.serve.fake import FakeWorker

W = TypeVar("W", bound=Worker)


@pytest.fixture
def started():
    """Starts the workers given to it, and stops them after the test."""
    workers: list[Worker] = []

    def start(worker: W) -> W:
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop(drain=False)


@pytest.fixture
def gpt(started):
    return started(FakeWorker(name="gpt"))


@pytest.fixture
def bert(started):
    return started(FakeWorker(name="bert", kind="encoder"))
