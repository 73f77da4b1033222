"""The static engine's cache pool: bucketed bases, lent again once their views are gone, in address order."""

from __future__ import annotations

import gc

import pytest
import torch

from hotrod.runtime.pool import CachePool, batch_bucket


@pytest.mark.parametrize(("rows", "bucket"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (33, 40)])
def test_batch_buckets(rows, bucket):
    assert batch_bucket(rows) == bucket


def test_bucket_refuses_no_rows():
    with pytest.raises(ValueError, match="rows"):
        batch_bucket(0)


def test_views_are_leading_rows_of_a_zeroed_bucketed_base():
    pool = CachePool(torch.device("cpu"), torch.bfloat16)
    view = pool.take((5, 2, 3, 4))
    base = pool.base_of(view)
    assert view.shape == (5, 2, 3, 4) and view.dtype == torch.bfloat16
    assert base.shape == (8, 2, 3, 4) and view.data_ptr() == base.data_ptr()
    assert not view.any()
    assert pool.base_of(view.clone()) is None  # not lent by the pool


def test_a_base_is_lent_again_zeroed_once_its_view_is_gone():
    pool = CachePool(torch.device("cpu"), torch.float32)
    first = pool.take((2, 1, 4, 2))
    address = first.data_ptr()
    first.fill_(float("nan"))
    held = pool.take((2, 1, 4, 2))  # the first is still lent: new memory
    assert held.data_ptr() != address
    del first
    gc.collect()
    again = pool.take((2, 1, 4, 2))
    assert again.data_ptr() == address and not again.isnan().any() and not again.any()


def test_bases_come_back_in_address_order_whatever_order_they_left():
    pool = CachePool(torch.device("cpu"), torch.float32)
    views = [pool.take((1, 2, 8, 4)) for _ in range(4)]
    addresses = sorted(v.data_ptr() for v in views)
    views.reverse()
    del views
    gc.collect()
    again = [pool.take((1, 2, 8, 4)) for _ in range(4)]
    assert [v.data_ptr() for v in again] == addresses


def test_free_bases_beyond_the_budget_are_dropped():
    pool = CachePool(torch.device("cpu"), torch.float32, keep_bytes=1000)
    for capacity in (10, 20, 30):  # each 4 * 4 * capacity bytes, given back at once
        pool.take((1, 4, capacity, 1))
    pool.take((1, 1, 1, 1))
    kept = sum(b.numel() * 4 for bases in pool._free.values() for b in bases)
    assert kept <= 1000


def test_a_take_reuses_exactly_the_bases_whose_views_died():
    pool = CachePool(torch.device("cpu"), torch.float32)
    views = [pool.take((3, 2, 4, 8)) for _ in range(40)]
    dead = {views[i].data_ptr() for i in range(0, 40, 2)}
    views = views[1::2]  # half of them die; the other half stay lent
    again = [pool.take((3, 2, 4, 8)) for _ in range(20)]
    assert {v.data_ptr() for v in again} == dead
    assert pool.lent == 40
    del views, again
    assert pool.lent == 0 and pool._free_bytes == 40 * 4 * 2 * 4 * 8 * 4  # bucket of 3 rows is 4
