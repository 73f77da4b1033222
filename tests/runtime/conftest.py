"""`products_path`: the product kernels' tests run on each path this CPU can take, the tiles (AMX) and, with
them left out, the AVX-512 path a CPU without them (a Zen 4) takes, so both are held to the same answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hotrod.runtime import native

PATHS = ("own", "without-tiles")


@pytest.fixture(params=PATHS)
def products_path(request) -> Iterator[str]:
    if request.param == PATHS[0]:
        yield request.param
        return
    if not native.has_flags(("amx_tile",)):
        pytest.skip("no tiles on this CPU to leave out: its own path is the one without them")
    with native.tiles_left_out():
        yield request.param
