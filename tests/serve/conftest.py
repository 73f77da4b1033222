"""Started fake engines, one of each kind, for the tests of the HTTP layer."""

from __future__ import annotations

import pytest

from tests.serve.fake import FakeEngine


@pytest.fixture
def gpt():
    engine = FakeEngine(name="gpt")
    engine.start()
    yield engine
    engine.stop(drain=False)


@pytest.fixture
def bert():
    engine = FakeEngine(name="bert", kind="encoder")
    engine.start()
    yield engine
    engine.stop(drain=False)
