"""A peer in an environment of its own: requests and replies over the pipe, its failures as one line."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from hotrod.bench.remote import RemoteError, Worker, has_module

FAKE = textwrap.dedent('''
    import os, pickle, sys
    import numpy as np
    out = os.fdopen(os.dup(1), "wb"); os.dup2(2, 1)
    while True:
        try:
            request = pickle.load(sys.stdin.buffer)
        except EOFError:
            break
        print("noise a library printed")  # must not be read as a reply
        if request["op"] == "close":
            break
        if request["op"] == "die":
            os._exit(3)
        if request["op"] == "build":
            reply = {"ok": True, "echo": request["args"]["n"]}
        elif request["op"] == "call":
            reply = {"ok": True, "value": np.arange(4 if request["first"] else 6, dtype=np.int64)}
        else:
            reply = {"ok": False, "error": "ValueError: no such op"}
        pickle.dump(reply, out); out.flush()
''')


@pytest.fixture
def worker(tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE)
    worker = Worker(sys.executable, script, tmp_path / "logs" / "fake.log")
    yield worker
    worker.close()


def test_requests_and_replies_cross_the_pipe(worker, tmp_path):
    assert worker.build(n=7)["echo"] == 7
    assert torch.equal(worker.call(), torch.arange(6))
    assert torch.equal(worker.call(first=True), torch.arange(4))
    worker.close()
    assert "noise a library printed" in (tmp_path / "logs" / "fake.log").read_text()


def test_a_failure_in_the_worker_is_its_one_line(worker):
    with pytest.raises(RemoteError, match="^ValueError: no such op$"):
        worker.request("nonsense")
    assert worker.build(n=1)["echo"] == 1  # the worker goes on


def test_a_worker_that_dies_is_reported_with_its_exit_code(worker):
    with pytest.raises(RemoteError, match="exited with code 3"):
        worker.request("die")
    worker.close()  # closing a dead worker is quiet


def test_has_module_asks_the_other_python():
    assert has_module(sys.executable, "numpy")
    assert not has_module(sys.executable, "no_such_module_here")
    assert not has_module("/no/such/python", "numpy")
