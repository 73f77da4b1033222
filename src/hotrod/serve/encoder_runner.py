"""The model side of the server for encoders: one dynamic batch of embedding and task-row requests a call."""

from __future__ import annotations

from typing import Any

import torch

from hotrod.batching import plan
from hotrod.model import HotrodModel
from hotrod.pipelines.sentence_tokens import Tokenized
from hotrod.serve.scheduler import Request

ROWS = "rows"  # the options of a submission of task rows, beside an embedding's (pooling, normalize, prompt)
HIDDEN = "hidden"  # the options of a submission of rows whose every token's last hidden state is wanted


class EncoderRunner:
    """One dynamic batch of encoder requests: embeddings through the model's padding-free forward, task rows
    through its head (`HotrodModel.run_rows`). Every request's rows of one sort share one call, so a
    100-document rerank and a 3-text classification run as one batch."""

    def __init__(self, model: HotrodModel):
        self.model = model

    @torch.inference_mode()
    def run(self, requests: list[Request]) -> list[Any]:
        """Each request's result, in order: its embeddings [rows, hidden], or its rows' outputs by name."""
        results: dict[int, Any] = {}
        heads = [r for r in requests if r.options == ROWS]
        if heads:
            results.update(zip((r.id for r in heads), self.run_rows(heads)))
        hidden = [r for r in requests if r.options == HIDDEN]
        if hidden:
            results.update(zip((r.id for r in hidden), self.hidden(hidden)))
        embeds = [r for r in requests if r.options not in (ROWS, HIDDEN)]
        if embeds:
            results.update(zip((r.id for r in embeds), self.embed(embeds)))
        return [results[r.id] for r in requests]

    def run_rows(self, requests: list[Request]) -> list[list[dict[str, torch.Tensor]]]:
        """Each request's rows' outputs, from one call over every request's rows."""
        rows = [row for r in requests for row in r.rows]
        outputs = self.model.run_rows(rows, batch_size=max(len(rows), 1))
        return _split(outputs, [len(r.rows) for r in requests])

    @torch.inference_mode()
    def embed(self, requests: list[Request]) -> list[torch.Tensor]:
        """Embeddings per request; requests with the same (pooling, normalize, prompt length) share one call."""
        results: dict[int, torch.Tensor] = {}
        for options in dict.fromkeys(r.options for r in requests):
            pooling, normalize, prompt_length = options
            group = [r for r in requests if r.options == options]
            rows = [row for r in group for row in r.rows]
            vectors = self.model.embed(Tokenized(rows, prompt_length), pooling=pooling, normalize=normalize,
                                       batch_size=max(len(rows), 1))
            results.update(zip((r.id for r in group), _split(vectors, [len(r.rows) for r in group])))
        return [results[r.id] for r in requests]

    @torch.inference_mode()
    def hidden(self, requests: list[Request]) -> list[list[torch.Tensor]]:
        """Each request's rows' last hidden state, [tokens, hidden] a row, rows of similar length run together."""
        rows = [row for r in requests for row in r.rows]
        states: list[torch.Tensor] = [torch.empty(0)] * len(rows)
        for group in plan([len(row) for row in rows], max(len(rows), 1)):
            hidden, _ = self.model.hidden_states([rows[i] for i in group])
            for j, i in enumerate(group):
                states[i] = hidden[j, : len(rows[i])]
        return _split(states, [len(r.rows) for r in requests])


def _split(items, counts: list[int]) -> list:
    """`items` cut into consecutive parts of `counts` items each."""
    parts, start = [], 0
    for count in counts:
        parts.append(items[start : start + count])
        start += count
    return parts
