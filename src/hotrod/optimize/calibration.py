"""Calibration inputs: real feeds for every graph, recorded while the fp32 model runs on texts.

Static int8 needs activation ranges and the fp16 overflow search needs activations to look at; both
must see what the graphs see at run time, including the KV cache of later decoding steps. Rather than
build those inputs per family, the fp32 model is run through the ordinary decoding loop (or forward, for
encoders) with a backend wrapper that records each graph's feeds as numpy arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hotrod.errors import HotrodError
from hotrod.pipelines.base import Row
from hotrod.verification.inputs import token_rows
from hotrod.verification.rows import task_rows

if TYPE_CHECKING:
    from hotrod.runtime.base import Held

Feeds = dict[str, list[dict[str, np.ndarray]]]  # graph name -> recorded input dicts
class _Recorder:
    """A backend that forwards every call and keeps a numpy copy of each graph's feeds."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.feeds: Feeds = {}

    def run(self, graph: str, feeds: Mapping[str, Any], into: Mapping[str, Any] | None = None,
            held: Held | None = None) -> dict[str, Any]:
        # Copied before the run: a cache buffer fed here is updated in place by it.
        names = self.inner.contracts[graph].input_names  # in the graph's order, whatever the caller's
        every = {**feeds, **held.feeds} if held is not None else feeds
        self.feeds.setdefault(graph, []).append({name: _array(self.inner, every[name]) for name in names})
        return self.inner.run(graph, feeds, into, held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _array(backend: Any, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    return backend.to_torch(value).numpy().copy()


def capture_feeds(model: Any, texts: Sequence[str], max_new_tokens: int = 8, per_graph: int = 32,
                  seed: int = 0) -> Feeds:
    """Run `model` (a HotrodModel) on `texts` one at a time and return up to `per_graph` feeds per graph.

    Language models generate `max_new_tokens` greedily, so the step graphs are seen with real caches;
    encoders run one forward per input of their task (a text, a pair, a question with a context window). Without a tokenizer, seeded random token ids of the texts' word
    counts stand in (the ranges then describe random inputs, which is all such a model ever sees).
    """
    if not texts:
        raise HotrodError("calibration needs at least one text")
    recorder = _Recorder(model.backend)
    model.backend = recorder
    try:
        run_texts(model, texts, max_new_tokens, seed)
    finally:
        model.backend = recorder.inner
    return {graph: spread(items, per_graph) for graph, items in recorder.feeds.items()}


def run_texts(model: Any, texts: Sequence[str], max_new_tokens: int = 8, seed: int = 0) -> None:
    """Run `model` on `texts` as calibration does (see `capture_feeds`), for what watches it run: the
    torch engine's fp16 overflow search hooks the modules themselves (`hotrod.runtime.cast`)."""
    if model.spec.generates:
        _generate_all(model, texts, max_new_tokens, seed)
    else:
        _encode_all(model, texts)


def _generate_all(model: Any, texts: Sequence[str], max_new_tokens: int, seed: int) -> None:
    rows = [row for row in token_rows(model, texts, model.spec.room(max_new_tokens), seed) if row] or [[0]]
    for row in rows:
        ids = torch.tensor([row], dtype=torch.long)
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                       min_new_tokens=max_new_tokens, do_sample=False, num_beams=1)


def _encode_all(model: Any, texts: Sequence[str]) -> None:
    """One forward per input as the encoder's task builds it: texts, text pairs, question + context
    windows (`hotrod.verification.rows.task_rows`), with their token types."""
    for row in task_rows(model, texts) or [Row([0])]:
        ids = torch.tensor([row.input_ids], dtype=torch.long)
        types = None if row.token_type_ids is None else torch.tensor([row.token_type_ids], dtype=torch.long)
        model(ids, token_type_ids=types)


def spread(items: list, count: int) -> list:
    """At most `count` items, evenly spread, so prefill and late decoding steps are both represented."""
    if len(items) <= count:
        return items
    picks = np.linspace(0, len(items) - 1, count).round().astype(int)
    return [items[i] for i in picks]


def graph_feed(input_names: Sequence[str], feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A recorded feed restricted to one graph's inputs; a missing input is an error, not a silent skip."""
    missing = [name for name in input_names if name not in feed]
    if missing:
        raise HotrodError(f"calibration feeds lack graph input(s) {', '.join(missing)}; "
                          "record them from this same graph")
    return {name: np.asarray(feed[name]) for name in input_names}
