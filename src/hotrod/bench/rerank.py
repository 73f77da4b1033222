"""Cross-encoder reranking (W7): the bench's word vocabulary, and the peers that rerank text.

A seeded random checkpoint has no tokenizer, and the reranking peers (sentence-transformers' `CrossEncoder`,
Infinity) take text. The W7 checkpoint therefore carries a BERT tokenizer over a made-up vocabulary: id i
(from `FIRST_WORD`) is the word "w<i>", so the ids a case draws become text that tokenizes back to exactly
those ids, and every system scores the same pairs.

hotrod's server has no rerank route on this branch: hotrod is timed on `HotrodModel.run_rows` over the pairs'
rows (the work the route would batch), the peers on their own rerank calls over the same pairs' text.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from hotrod.bench.case import Case
from hotrod.bench.runners import System, dir_size
from hotrod.errors import HotrodError

PAD, UNK, CLS, SEP, MASK = range(5)
FIRST_WORD = 5
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def save_tokenizer(path: Path, vocab_size: int) -> None:
    """A BERT word-piece tokenizer whose vocabulary is the specials, then "w5".."w<vocab_size-1>"; built with
    `tokenizers` and saved as PreTrainedTokenizerFast, which every transformers release loads alike."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = [*SPECIALS, *(f"w{i}" for i in range(FIRST_WORD, vocab_size))]
    tokenizer = Tokenizer(models.WordPiece({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
                            model_input_names=["input_ids", "token_type_ids", "attention_mask"]).save_pretrained(path)


def texts(ids: torch.Tensor, mask: torch.Tensor, query: int) -> tuple[str, list[str]]:
    """The query and each row's document as text, from rows laid out by `Case` for reranking."""
    def words(tokens: torch.Tensor) -> str:
        return " ".join(f"w{int(t)}" for t in tokens)

    lengths = mask.sum(dim=1).tolist()
    return words(ids[0, 1:1 + query]), [words(ids[row, query + 2:length - 1]) for row, length in enumerate(lengths)]


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


def infinity_system(case: Case, ids: torch.Tensor, mask: torch.Tensor, device: str, threads: int) -> System:
    """Infinity's engine (`infinity-emb`, torch engine) reranking the documents, driven on its own event loop."""
    from infinity_emb import AsyncEmbeddingEngine, EngineArgs

    query, documents = texts(ids, mask, case.query)
    engine = AsyncEmbeddingEngine.from_args(EngineArgs(model_name_or_path=case.source, engine="torch",
                                                       device=device, bettertransformer=False))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    run(engine.astart())

    async def rerank() -> list[float]:
        scores, _ = await engine.rerank(query=query, docs=documents, raw_scores=True)
        return scores

    def call() -> torch.Tensor:
        return _in_order(run(rerank()))[:, None]

    def close() -> None:
        run(engine.astop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    return System(call, None, "fp32", dir_size(Path(case.source)), close=close)


def _in_order(scores: list) -> torch.Tensor:
    """Infinity's scores in the documents' order: plain floats in order, or results that name their index."""
    if all(isinstance(s, int | float) for s in scores):
        return torch.tensor([float(s) for s in scores])
    ordered = torch.empty(len(scores))
    for result in scores:
        ordered[int(result.index)] = float(result.relevance_score)
    return ordered


def rank_agreement(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Share of documents that land at the same rank: what a reranker's user sees of a score difference."""
    return float((ours.float().flatten().argsort(descending=True)
                  == theirs.float().flatten().argsort(descending=True)).float().mean())
