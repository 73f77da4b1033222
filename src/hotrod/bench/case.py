"""One shape `hotrod bench` times: its own module, below the harness and the peers that all take it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotrod.kinds import KindSpec
from hotrod.kinds import spec as kind_spec


@dataclass(frozen=True)
class Case:
    """One shape to time: `lengths` are the prompt lengths of the batch's rows."""

    name: str
    source: str
    kind: str
    lengths: tuple[int, ...]
    new_tokens: int = 0

    @property
    def spec(self) -> KindSpec:
        return kind_spec(self.kind)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def seq(self) -> int:
        return max(self.lengths)

    def inputs(self, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded ids; rows padded left for generation and right for encoders, as each side expects."""
        generator = torch.Generator().manual_seed(1234)
        ids = torch.zeros(self.batch, self.seq, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, length in enumerate(self.lengths):
            span = self.spec.prompt_span(length, self.seq)
            ids[row, span] = torch.randint(2, vocab_size, (length,), generator=generator)
            mask[row, span] = 1
        return ids, mask

    def generate_kwargs(self) -> dict | None:
        if not self.spec.generates:
            return None
        return {"max_new_tokens": self.new_tokens, "min_new_tokens": self.new_tokens, "do_sample": False,
                "num_beams": 1}
