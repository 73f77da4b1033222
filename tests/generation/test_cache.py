"""The self-attention cache's sizing: growth in rounded steps within the model's positions, and joins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hotrod.generation.cache import ROUND_POSITIONS, SelfCache
from hotrod.registry import Dims


class _Backend:
    """What SelfCache asks of a backend, on plain torch tensors."""

    def empty(self, shape):
        return torch.zeros(shape)

    def view(self, value):
        return value


def _cache(rows: int, capacity: int, max_positions: int | None = 1024, fill: float = 1.0) -> SelfCache:
    dims = Dims(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, head_dim=4, max_positions=max_positions)
    cache = SelfCache(_Backend(), dims, 2, capacity)
    cache.allocate(rows, capacity)
    cache.lengths = torch.full((rows,), min(capacity, 3), dtype=torch.long)
    for buffer in cache.buffers:
        buffer.fill_(fill)
    return cache


@pytest.mark.parametrize(("capacity", "asked", "max_positions", "grown"), [
    (100, 101, 1024, 192),  # 1.5x, up to a multiple of the step
    (100, 300, 1024, 320),  # what was asked, up to a multiple
    (100, 101, 130, 130),  # never past the model's positions
    (100, 200, 130, 200),  # nor under what was asked
    (100, 101, None, 192),  # relative positions: no limit
    (100, 90, 1024, 100),  # room enough: unchanged
])
def test_reserve_grows_in_rounded_steps_within_the_models_positions(capacity, asked, max_positions, grown):
    cache = _cache(2, capacity, max_positions)
    cache.reserve(asked)
    assert cache.capacity == grown and all(b.shape[2] == grown for b in cache.buffers)
    assert all(bool((b[:, :, :3] == 1).all()) for b in cache.buffers)  # the rows' positions were kept


def test_a_join_takes_every_part_at_once_sized_for_what_the_rows_will_need():
    first, second, third = _cache(2, 40, fill=1), _cache(1, 10, fill=2), _cache(3, 20, fill=3)
    first.join([second, third], positions=100)
    assert first.capacity == -(-100 // ROUND_POSITIONS) * ROUND_POSITIONS
    assert first.lengths.tolist() == [3] * 6
    for buffer in first.buffers:
        assert buffer.shape[:3] == (6, 2, first.capacity)
        assert [float(buffer[row, 0, 0, 0]) for row in range(6)] == [1, 1, 2, 3, 3, 3]
    roomy = _cache(1, 200)
    roomy.join([_cache(1, 10)], positions=50)  # the parts hold enough already: no rounding up
    assert roomy.capacity == 200


def test_joining_nothing_sizes_the_rows_for_what_they_will_need():
    """A lone prefilled group (prompt-wide) grows to what its rows will need, rounded, not by half again."""
    cache = _cache(2, 100)
    cache.join([], positions=116)
    assert cache.capacity == 128
    cache.join([], positions=50)
    assert cache.capacity == 128


def test_replacing_the_buffers_lets_the_held_set_made_of_them_go():
    cache = _cache(2, 16)
    held = cache.held()
    assert cache.held() is held  # the same buffers: the same object, which a backend keeps bound
    cache.buffers = []
    assert cache._held is None


def test_a_passes_spans_are_arrays_of_their_own():
    from hotrod.generation.cache import _spans

    for rows in (1, 3):
        spans = _spans(rows, 4)
        assert spans.flags.writeable and spans.flags.c_contiguous and spans.tolist() == [[0, 1, 2, 3]] * rows


def test_advancing_keeps_the_lengths_tensor_and_its_numpy_memory_in_step():
    cache = _cache(2, 16)
    lengths = cache.lengths
    cache.advance()
    assert cache.lengths is lengths and lengths.tolist() == [4, 4] and cache.host_lengths.tolist() == [4, 4]
    cache.lengths = torch.tensor([1, 2])  # a new tensor: its own memory is advanced from then on
    cache.advance()
    assert cache.lengths.tolist() == [2, 3] and lengths.tolist() == [4, 4]


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_steps_logits_land_in_a_buffer_of_the_states_own_where_the_backend_writes_outputs(zoo, name):
    """On onnxruntime a step allocates no logits: every step writes the same [rows, vocab] buffer."""
    from hotrod.generation import config as gen_config

    model = zoo.model(name, "onnxruntime")
    ids = torch.tensor([[5, 6, 7]])
    state = model.decoding_state(model.settings(3, gen_config.merge(model.generation_config, None, {})))
    state.start(ids, torch.ones_like(ids), 1)
    first = state.step(torch.tensor([4]))
    values = first.clone()
    second = state.step(torch.tensor([9]))
    assert second.data_ptr() == first.data_ptr() and second.shape == (1, model.dims.vocab_size)
    assert not torch.equal(second, values)  # written over by the next step, as the contract says
    wide = state.verify(np.array([[3, 4, 5]]))
    narrow = state.verify(np.array([[6]]))
    assert wide.shape == (1, 3, model.dims.vocab_size) and narrow.shape == (1, 1, model.dims.vocab_size)
    assert narrow.data_ptr() == wide.data_ptr()  # a pass's logits: the front of one buffer of the state's own
