"""Padding-free encoder batches: the sub-batch plan, and forward results equal to unbatched ones."""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import pytest
import torch

from hotrod.batching import plan, trailing_lengths
from tests.zoo import CASES, load_on, prompt_batch


def _cost(groups, lengths, overhead):
    return sum(overhead + len(g) * max(lengths[i] for i in g) for g in groups)


def _brute_force(lengths, max_batch, overhead):
    """The cheapest split of the sorted rows, by trying every set of cut points."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = None
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        groups, current = [], [order[0]]
        for index, cut in zip(order[1:], cuts):
            if cut:
                groups.append(current)
                current = []
            current.append(index)
        groups.append(current)
        if max(map(len, groups)) <= max_batch:
            cost = _cost(groups, lengths, overhead)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_batch", [1, 3, 16])
def test_plan_covers_every_row_once_and_is_optimal(seed, max_batch):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 60, (9,), generator=generator).tolist()
    groups = plan(lengths, max_batch, overhead=16)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(len(g) <= max_batch for g in groups)
    assert _cost(groups, lengths, 16) == _brute_force(lengths, max_batch, 16)


def test_plan_keeps_equal_lengths_together_and_splits_far_apart_ones():
    assert plan([10, 10, 10], 8) == [[0, 1, 2]]
    assert plan([4, 200, 5], 8) == [[0, 2], [1]]
    with pytest.raises(ValueError):
        plan([1], 0)


def test_trailing_lengths_only_for_right_padding():
    assert trailing_lengths(torch.tensor([[1, 1, 0], [1, 1, 1]])) == [2, 3]
    assert trailing_lengths(torch.tensor([[0, 1, 1], [1, 1, 1]])) is None
    assert trailing_lengths(torch.tensor([[1, 0, 1], [1, 1, 1]])) is None


def test_padded_forward_equals_each_row_alone(zoo, encoder_case, backend):
    model = zoo.model(encoder_case, backend)
    ids, mask = prompt_batch(CASES[encoder_case], (40, 3, 17, 3, 60, 9), seed=5)
    batched = model(input_ids=ids, attention_mask=mask).last_hidden_state
    for row, length in enumerate(mask.sum(1).tolist()):
        alone = model(input_ids=ids[row : row + 1, :length]).last_hidden_state[0]
        torch.testing.assert_close(batched[row, :length], alone, atol=1e-5, rtol=0)
        assert not batched[row, length:].any()


@contextmanager
def call_shapes(model):
    """The input shapes of the encoder calls made inside the block."""
    shapes = []
    run = model.backend.run

    def spy(graph, feeds):
        shapes.append(tuple(feeds["input_ids"].shape))
        return run(graph, feeds)

    model.backend.run = spy
    try:
        yield shapes
    finally:
        del model.backend.run


def test_padded_forward_runs_sub_batches_not_the_padded_batch(zoo, encoder_case):
    model = zoo.model(encoder_case, "onnxruntime")
    ids, mask = prompt_batch(CASES[encoder_case], (50, 4, 4, 52), seed=1)
    with call_shapes(model) as widths:
        model(input_ids=ids, attention_mask=mask)
    assert sorted(widths) == [(2, 4), (2, 52)]


def test_a_backend_whose_calls_cost_more_than_padding_runs_one_padded_call(zoo):
    """A recorded GPU engine says so (`call_overhead_tokens`); the padded positions still come back zero."""
    model = load_on(zoo.checkpoint("bert"), "static")
    ids, mask = prompt_batch(CASES["bert"], (50, 4, 4, 52), seed=1)
    expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.backend.call_overhead_tokens = 1 << 30
    with call_shapes(model) as widths:
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert widths == [(4, 52)]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert not got[1, 4:].any()


def test_one_padded_call_keeps_the_rows_order_and_trailing_columns(zoo):
    """The one call runs the rows as given, over the longest row's columns: columns past it come back zero."""
    model = load_on(zoo.checkpoint("bert"), "static")
    ids, mask = prompt_batch(CASES["bert"], (50, 4, 52, 4), seed=1)
    ids = torch.nn.functional.pad(ids, (0, 3))  # three columns no row reaches
    mask = torch.nn.functional.pad(mask, (0, 3))
    expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.backend.call_overhead_tokens = 1 << 30
    with call_shapes(model) as widths:
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert widths == [(4, 52)] and got.shape == expected.shape == (4, 55, got.shape[-1])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert not got[:, 52:].any() and not got[1, 4:].any()
