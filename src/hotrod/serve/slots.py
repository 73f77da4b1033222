"""The running batch as slots: one decoding state whose rows are requests or free slots.

Why slots: copying the whole batch's cache for every arrival and departure would cost as much as the
steps themselves. A finished row leaves a free slot (released: it runs on at length 0, unread, until
reused); a newcomer takes a free slot in place, copying only its own cache. The batch is compacted (one
copy) once most of its slots are free, and its buffers shrink when the longest request has left.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from hotrod.generation.state import DecodingState
from hotrod.model import HotrodModel
from hotrod.serve.scheduler import Request


@dataclass
class Group:
    state: DecodingState
    rows: list[Request | None]  # None: a free slot

    def free(self) -> list[int]:
        return [i for i, r in enumerate(self.rows) if r is None]


def wanted_positions(rows: Iterable[Request | None]) -> int:
    """Cache positions per row that `rows` will need at most (free slots need none)."""
    return max((row.options.settings.max_length for row in rows if row is not None), default=0)


def compact(group: Group, force: bool = False, least: int = 1) -> None:
    """Drop the free slots of `group` (one copy; seq2seq states also drop encoder columns none use), but
    keep a multiple of `least` slots while any row is live (the model's invariant rows). A group starts
    with such a multiple and this keeps it, so there are always free slots enough."""
    keep = [i for i, r in enumerate(group.rows) if r is not None]
    if keep and len(keep) % least:
        keep = sorted(keep + group.free()[: -len(keep) % least])
    if force or len(keep) < len(group.rows):
        group.rows = [group.rows[i] for i in keep]
        if keep:
            group.state.keep(torch.tensor(keep, dtype=torch.long))


def position_bytes(model: HotrodModel) -> int:
    """Bytes one cached position of one row takes: key and value of every decoder layer, fp32."""
    dims = model.dims
    return 2 * model.spec.cache_layers(dims) * dims.num_heads * dims.head_dim * 4
