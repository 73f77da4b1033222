"""The self-attention cache's sizing: growth in rounded steps within the model's positions, and joins."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import hotrod
from hotrod.generation.self_cache import ROUND_POSITIONS, SelfCache
from hotrod.registry import Dims


class _Backend:
    """What SelfCache asks of a backend, on plain torch tensors."""

    pools_cache = False

    def empty(self, shape):
        return torch.zeros(shape)

    def view(self, value):
        return value

    def select(self, value, index):
        return value[index]


def _dims(max_positions: int | None = 1024) -> Dims:
    return Dims(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, head_dim=4, max_positions=max_positions)


def _cache(rows: int, capacity: int, max_positions: int | None = 1024, fill: float = 1.0) -> SelfCache:
    cache = SelfCache(_Backend(), _dims(max_positions), 2, capacity)
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
    from hotrod.generation.feeds import position_spans

    for rows in (1, 3):
        spans = position_spans(rows, 4)
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


def test_a_recycled_cache_takes_the_spares_buffers_zeroed_where_it_wrote():
    spare = _cache(2, 16, fill=5.0)
    spare.feeds(np.array([6, 6]), 7)  # a run wrote 7 positions a row
    buffers, held = spare.buffers, spare.held()
    for buffer in buffers:
        buffer[:, :, 7:] = 0  # what no run wrote is zero already
    cache = SelfCache(_Backend(), _dims(), 2, 8)
    cache.recycle(spare)
    cache.allocate(2, 12)
    assert cache.buffers is buffers and cache.held() is held  # the same memory, kept bound as one set
    assert cache.capacity == 16 and cache.lengths.tolist() == [0, 0]
    assert all(not b.any() for b in cache.buffers)


def test_a_spare_of_other_rows_or_fewer_positions_is_not_taken():
    for rows, capacity in ((3, 8), (2, 32)):
        spare = _cache(2, 16)
        cache = SelfCache(_Backend(), _dims(), 2, capacity)
        cache.recycle(spare)
        cache.allocate(rows, capacity)
        assert cache.buffers is not spare.buffers and cache.buffers[0].shape[:3] == (rows, 2, capacity)
        assert all(not b.any() for b in cache.buffers)


def test_a_spare_whose_buffers_were_replaced_is_zeroed_whole():
    spare = _cache(2, 16, fill=3.0)
    spare.reorder(torch.tensor([1, 0]))  # new buffers: what they hold is not known
    assert spare.written is None
    cache = SelfCache(_Backend(), _dims(), 2, 16)
    cache.recycle(spare)
    cache.allocate(2, 16)
    assert cache.buffers is spare.buffers and all(not b.any() for b in cache.buffers)


def _kept(model):
    """The cache buffers of the state finished generate() calls left last."""
    return model._spares._kept[-1][0].kv.buffers


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_generate_starts_in_the_last_calls_buffers_and_decodes_as_in_new_ones(zoo, backend, name):
    """Each call takes the buffers the last one left (zeroed): the same tokens as a state of its own would
    decode, whatever the calls before it wrote. A backend that pools its buffers itself (the static engine)
    gets them all back: no call keeps any."""
    model = zoo.model(name, backend)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, model.dims.vocab_size, (1, n), generator=generator) for n in (9, 3, 9, 5)]
    recycled = [model.generate(p, max_new_tokens=6, min_new_tokens=6) for p in prompts]
    fresh = []
    for prompt in prompts:
        model.free_cache()  # no spare: a state in buffers of its own
        fresh.append(model.generate(prompt, max_new_tokens=6, min_new_tokens=6))
    assert all(torch.equal(a, b) for a, b in zip(recycled, fresh))
    if model.backend.pools_cache:
        assert len(model._spares) == 0 and model.backend.pool.lent == 0
        return
    kept = _kept(model)
    assert model.generate(prompts[3], max_new_tokens=6) is not None and _kept(model) is kept
    assert len(model._spares) == 1
    with pytest.raises(hotrod.HotrodError):  # refused after the spare was taken: it is given back as it was
        model.generate(torch.tensor([[3, 4], [5, 6]]), prompt_lookup_num_tokens=2)
    model.generate(prompts[3], max_new_tokens=6)
    assert _kept(model) is kept and len(model._spares) == 1
    if name == "t5":  # the cross K/V were that call's alone
        spare = model._spares._kept[-1][0]
        assert spare.cross == [] and spare.mask is None and spare.kv._held is None


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_a_sources_beams_read_one_copy_of_its_cross_kv_where_the_backend_shares_sources(zoo, backend, name):
    """Two sources of 4 beams: 8 rows over 2 copies of the cross K/V and mask (one a row on the static
    engine, which pads every feed to its bucket); reordering beams leaves them, and a batch that changes
    rows (a server's) gives each row its own copy first, the rows' logits unchanged."""
    from hotrod.generation import config as gen_config

    model = zoo.model(name, backend)
    state = model.decoding_state(model.settings(4, gen_config.merge(model.generation_config, None, {})))
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    _, first = state.start(ids, torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]), 4)
    sources = 2 if model.backend.shares_sources else 8
    assert state.mask.shape[0] == sources and state.group == 8 // sources
    assert all(model.backend.view(cross).shape[0] == sources for cross in state.cross)
    assert torch.equal(first[0], first[3]) and torch.equal(first[4], first[7])
    cross = list(state.cross)
    state.reorder(torch.tensor([1, 0, 3, 2, 4, 4, 5, 6]))
    tokens = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10])
    shared = state.step(tokens).clone()
    assert all(a is b for a, b in zip(state.cross, cross))
    state.keep(torch.arange(8))  # as a server does when no row leaves
    assert state.group == 1 and state.mask.shape[0] == 8
    state.rewind(1)
    torch.testing.assert_close(state.step(tokens), shared, rtol=1e-5, atol=1e-5)


def test_calls_on_many_threads_at_once_each_take_a_spare_of_their_own(zoo):
    model = zoo.model("gpt2", "onnxruntime")
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(2, model.dims.vocab_size, (1, 4 + i), generator=generator) for i in range(4)]
    alone = [model.generate(p, max_new_tokens=8, min_new_tokens=8) for p in prompts]
    barrier, outputs = threading.Barrier(len(prompts)), {}

    def call(i: int) -> None:
        for _ in range(3):
            barrier.wait()
            outputs.setdefault(i, []).append(model.generate(prompts[i], max_new_tokens=8, min_new_tokens=8))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(out, alone[i]) for i, outs in outputs.items() for out in outs)
    states = [state for state, _ in model._spares._kept]
    assert 1 <= len(states) <= len(prompts) and len({id(s.kv.buffers[0]) for s in states}) == len(states)


def test_spares_keep_the_latest_within_their_budget():
    from hotrod.generation.spares import Spares

    class _State:
        def __init__(self, size):
            self.size = size

        def nbytes(self):
            return self.size

    spares = Spares(budget=100)
    a, b, c, big = _State(40), _State(40), _State(40), _State(101)
    for state in (a, b, c, big):
        spares.give(state)
    assert len(spares) == 2 and spares.take() is c and spares.take() is b and spares.take() is None
    spares.give(a)
    spares.clear()
    assert spares.take() is None


def test_an_encoder_decoders_lookup_row_is_its_input_then_what_it_decoded():
    import types

    from hotrod.generation.lookup import Lookup

    lookup = Lookup(types.SimpleNamespace(sequences_include_prompt=False), types.SimpleNamespace(), 3)
    tokens = [99]  # the start token, never looked up
    lookup.begin(torch.tensor([[0, 5, 6, 7, 8]]), torch.tensor([[0, 1, 1, 1, 1]]), tokens)
    for new in ([5], [6, 7], [], [1, 2, 3, 4]):
        tokens += new
        lookup.draft(tokens, 3)
        assert lookup.row == [5, 6, 7, 8] + tokens[1:]
