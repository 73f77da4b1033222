"""Recorded calls: keyed by shapes and bound addresses, recorded on a second sighting, inputs copied in,
outputs copied out, least recently used dropped. On a CPU the recording is the function itself."""

from __future__ import annotations

import torch

from hotrod.runtime.graphs import Graphs


def _add_into(x, buffer):
    buffer.add_(x)
    return [buffer * 2]


def test_a_key_is_recorded_the_second_time_and_replayed_after():
    graphs = Graphs(limit=4)
    buffer = torch.zeros(3)
    key = ("g", buffer.data_ptr())
    for step in range(4):
        out = graphs.call(key, _add_into, [torch.full((3,), 1.0), buffer], copied=[True, False])
        assert torch.equal(out[0], torch.full((3,), 2.0 * (step + 1)))
    assert (graphs.stats.eager, graphs.stats.captured, graphs.stats.replayed) == (1, 1, 3)
    assert torch.equal(buffer, torch.full((3,), 4.0))  # the bound buffer is written where it lies


def test_inputs_are_copied_into_placeholders_and_outputs_out_of_the_recording():
    graphs = Graphs(limit=4)
    buffer = torch.zeros(2)
    results = [graphs.call("k", _add_into, [torch.tensor([float(i), 0.0]), buffer], [True, False])[0]
               for i in range(1, 4)]
    assert [r.tolist() for r in results] == [[2.0, 0.0], [6.0, 0.0], [12.0, 0.0]]  # each call saw its own input


def test_least_recently_used_recordings_are_dropped():
    graphs = Graphs(limit=2)
    for key in ("a", "b", "c"):
        for _ in range(2):
            graphs.call(key, lambda x: [x + 1], [torch.zeros(1)], [True])
    assert len(graphs) == 2 and graphs.stats.dropped == 1


def test_limit_zero_records_nothing():
    graphs = Graphs(limit=0)
    for _ in range(3):
        graphs.call("k", lambda x: [x + 1], [torch.zeros(1)], [True])
    assert graphs.stats.eager == 3 and len(graphs) == 0
