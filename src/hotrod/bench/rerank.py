"""Cross-encoder reranking (W7): the peers that rerank text, over the bench's word vocabulary (`hotrod.bench.vocab`).

hotrod is timed on `HotrodModel.run_rows` over the pairs' rows (the work `/v1/rerank` batches), the peers on
their own rerank calls over the same pairs' text.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from hotrod.bench.case import Case
from hotrod.bench.runners import System, dir_size
from hotrod.bench.vocab import texts
from hotrod.errors import HotrodError


def rerank_only(peer: str) -> Callable[[], System]:
    def refuse() -> System:
        raise HotrodError(f"{peer} times cross-encoder reranking only (W7)")

    return refuse


def cross_encoder_system(case: Case, ids: torch.Tensor, mask: torch.Tensor, device: str, threads: int) -> System:
    """sentence-transformers' CrossEncoder on PyTorch, scoring the pairs at its default batch size."""
    from sentence_transformers import CrossEncoder

    query, documents = texts(ids, mask, case.query)
    model = CrossEncoder(case.source, device=device, activation_fn=torch.nn.Identity())
    pairs = [(query, document) for document in documents]

    def call() -> torch.Tensor:
        return torch.as_tensor(model.predict(pairs, convert_to_numpy=True, show_progress_bar=False)).float()[:, None]

    return System(call, None, "fp32", dir_size(Path(case.source)))

