"""Started engines, stopped after each test: fake ones of each kind for the tests of the HTTP layer."""

from __future__ import annotations

from typing import TypeVar

import pytest

from hotrod.serve.protocol import Engine
from tests.serve.fake import FakeEngine

E = TypeVar("E", bound=Engine)


@pytest.fixture
def started():
    """Starts the engines given to it, and stops them after the test."""
    engines: list[Engine] = []

    def start(engine: E) -> E:
        engine.start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.stop(drain=False)


@pytest.fixture
def gpt(started):
    return started(FakeEngine(name="gpt"))


@pytest.fixture
def bert(started):
    return started(FakeEngine(name="bert", kind="encoder"))
