"""One shape `hotrod bench` times: its own module, below the harness and the peers that all take it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotrod.bench.vocab import CLS, FIRST_WORD, SEP
from hotrod.kinds import KindSpec
from hotrod.kinds import spec as kind_spec

# A beam case's search, spelled out for every system alike (transformers' defaults, and CTranslate2's): scores
# normalized by length to the power 1, no n-gram blocking, no early stop. With lengths forced, every
# hypothesis ends at the same length, so the length penalty orders them the same anywhere.
BEAM_SEARCH = {"length_penalty": 1.0, "no_repeat_ngram_size": 0, "early_stopping": False}


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
    num_beams: int = 1  # generation: 1 greedy, else beam search of that width (W10, W11)

    @property
    def spec(self) -> KindSpec:
        return kind_spec(self.kind)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def seq(self) -> int:
        return max(self.lengths)

    def inputs(self, vocab_size: int, pad: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded ids; rows padded left for generation and right for encoders, as each side expects. An id
        drawn equal to `pad` (a pad token past the first two ids, as Marian's last one) becomes the id below
        it: a pad token is no word of a source, and a peer may leave it out of its vocabulary."""
        generator = torch.Generator().manual_seed(1234)
        ids = torch.zeros(self.batch, self.seq, dtype=torch.long)
        mask = torch.zeros_like(ids)
        if self.query:
            return self._pairs(ids, mask, vocab_size, generator)
        for row, length in enumerate(self.lengths):
            span = self.spec.prompt_span(length, self.seq)
            row_ids = torch.randint(2, vocab_size, (length,), generator=generator)
            if pad is not None and pad > 2:
                row_ids[row_ids == pad] = pad - 1
            ids[row, span] = row_ids
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
        kwargs = {"max_new_tokens": self.new_tokens, "min_new_tokens": self.new_tokens, "do_sample": False,
                  "num_beams": self.num_beams}
        return {**kwargs, **BEAM_SEARCH} if self.num_beams > 1 else kwargs
