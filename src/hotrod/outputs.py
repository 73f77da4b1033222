"""ModelOutput: what a model's forward returns, read as transformers' outputs are read.

transformers' `ModelOutput` is an ordered mapping of the fields that are set: `out.logits`, `out["logits"]`,
`out[0]` (the first field set: the pooling snippet on sentence-transformers model cards reads
`model_output[0]`), `"logits" in out`, `out.keys()`, `out.to_tuple()`. This one answers all of them for the
fields hotrod computes, in transformers' order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ModelOutput:
    """What transformers' forward returns, for the fields hotrod computes."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    encoder_last_hidden_state: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # question answering
    end_logits: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None  # sparse-embedding: the SPLADE vectors [batch, vocab]

    def keys(self) -> list[str]:
        """The names of the fields that are set, in order."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def values(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.keys()]

    def items(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, getattr(self, name)) for name in self.keys()]

    def to_tuple(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.values())

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())
