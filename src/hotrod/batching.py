"""Padding-free encoder batches: split a batch of mixed lengths into sub-batches of similar length.

A padded batch computes every row at the longest row's length; on a CPU, where an encoder is compute
bound, that waste is the padded/real token ratio (W4: about 2000 padded for 1150 real tokens). Sorting
by length and cutting the sorted rows where padding would cost more than another call saves it, and the
results are the unbatched ones, since each row only ever sees its own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

# What one more engine call costs, in tokens' worth of compute: below this, padding is cheaper.
CALL_OVERHEAD_TOKENS = 16


def plan(lengths: Sequence[int], max_batch: int, overhead: int = CALL_OVERHEAD_TOKENS) -> list[list[int]]:
    """Row indices grouped into sub-batches that minimise padded tokens plus per-call overhead.

    Rows are sorted by length, so an optimal split is a set of cut points; dynamic programming finds them
    exactly (O(n * max_batch)). Each group is in ascending length order.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        width = lengths[order[end - 1]]  # the longest row of any group ending here
        for start in range(max(0, end - max_batch), end):
            cost = best[start] + overhead + (end - start) * width
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end:
        groups.append(order[cut[end]:end])
        end = cut[end]
    return groups[::-1]


def trailing_lengths(mask) -> list[int] | None:
    """Each row's real length if every row is right-padded (ones, then zeros), else None.

    Only then can a row be cut to its own length without moving its tokens' positions.
    """
    lengths = mask.sum(dim=1)
    for row, n in zip(mask, lengths.tolist()):
        if n == 0 or not bool(row[:n].all()) or bool(row[n:].any()):
            return None
    return lengths.tolist()
