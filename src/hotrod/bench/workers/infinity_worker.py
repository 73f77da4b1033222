"""Infinity's engine (`infinity-emb`, torch engine) reranking text, run as a bench peer in an environment of
its own.

infinity-emb pins sentence-transformers 3 and so transformers 4, older than hotrod's: it cannot be imported
beside hotrod. The harness starts this file with that environment's Python (`hotrod.bench.remote`) and
sends it the query and the documents as text; it imports nothing from hotrod.

It answers the requests of `loop.py`: `build` starts the engine on its own event loop, `call` reranks the
documents and returns their raw scores in the documents' order, one column.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))  # the loop beside this file (-I leaves it off the path)
    from loop import serve

    serve(Peer)


class Peer:
    """One engine over one checkpoint, answering for one query and its documents."""

    def __init__(self, source: str, query: str, documents: list[str], threads: int):
        import torch
        from infinity_emb import AsyncEmbeddingEngine, EngineArgs

        torch.set_num_threads(threads)
        self.query, self.documents = query, documents
        self.engine = AsyncEmbeddingEngine.from_args(EngineArgs(model_name_or_path=source, engine="torch",
                                                                device="cpu", bettertransformer=False))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._run(self.engine.astart())

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def info(self) -> dict:
        from importlib.metadata import version

        return {"version": version("infinity-emb"), "size_bytes": 0}

    def call(self, first: bool):
        import numpy as np

        scores, _ = self._run(self.engine.rerank(query=self.query, docs=self.documents, raw_scores=True))
        return in_order(scores, np)[:, None]


def in_order(scores: list, np):
    """Infinity's scores in the documents' order: plain floats in order, or results that name their index."""
    if all(isinstance(s, int | float) for s in scores):
        return np.asarray(scores, dtype=np.float32)
    ordered = np.empty(len(scores), dtype=np.float32)
    for result in scores:
        ordered[int(result.index)] = float(result.relevance_score)
    return ordered


if __name__ == "__main__":
    main()
