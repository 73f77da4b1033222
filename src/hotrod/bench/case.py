"""One shape `hotrod bench` times: its own module, below the harness and the peers that all take it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotrod.bench.vocab import CLS, FIRST_WORD, SEP
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
    task: str | None = None  # an encoder's head ("question-answering", "text-classification"); None: bare
    query: int = 0  # reranking (W7): each row is [CLS] query [SEP] document [SEP], the query `query` tokens

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
        if self.query:
            return self._pairs(ids, mask, vocab_size, generator)
        for row, length in enumerate(self.lengths):
            span = self.spec.prompt_span(length, self.seq)
            ids[row, span] = torch.randint(2, vocab_size, (length,), generator=generator)
            mask[row, span] = 1
        return ids, mask

    def token_types(self, mask: torch.Tensor) -> torch.Tensor | None:
        """Reranking rows' token types (the document and its [SEP] are type 1, as a tokenizer sets a pair's
        second text); None for other cases, whose rows are single texts."""
        if not self.query:
            return None
        positions = torch.arange(mask.shape[1])[None, :]
        return ((positions >= self.query + 2) & mask.bool()).long()

    def _pairs(self, ids: torch.Tensor, mask: torch.Tensor, vocab_size: int,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One query against every row's document, in BERT's pair layout with the bench vocabulary's special
        ids (`hotrod.bench.vocab`), right-padded: the text peers get the same rows back as text."""
        query = torch.randint(FIRST_WORD, vocab_size, (self.query,), generator=generator)
        for row, length in enumerate(self.lengths):
            document = torch.randint(FIRST_WORD, vocab_size, (length - self.query - 3,), generator=generator)
            ids[row, :length] = torch.cat([torch.tensor([CLS]), query, torch.tensor([SEP]), document,
                                           torch.tensor([SEP])])
            mask[row, :length] = 1
        return ids, mask

    def generate_kwargs(self) -> dict | None:
        if not self.spec.generates:
            return None
        return {"max_new_tokens": self.new_tokens, "min_new_tokens": self.new_tokens, "do_sample": False,
                "num_beams": 1}
