"""The bench's word vocabulary: ids that read back as words, for the reranking peers (W7), which take text.

A seeded random checkpoint has no tokenizer, and the reranking peers (sentence-transformers' `CrossEncoder`,
Infinity) take text. The W7 checkpoint therefore carries a BERT tokenizer over a made-up vocabulary: id i
(from `FIRST_WORD`) is the word "w<i>", so the ids a case draws (`hotrod.bench.case.Case`, in BERT's pair
layout with these special ids) become text that tokenizes back to exactly those ids, and every system
scores the same pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PAD, UNK, CLS, SEP, MASK = range(5)
FIRST_WORD = 5
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def save_tokenizer(path: Path, vocab_size: int, max_length: int) -> None:
    """A BERT word-piece tokenizer whose vocabulary is the specials, then "w5".."w<vocab_size-1>", for a model
    of `max_length` positions (the length a peer pads or truncates to); built with
    `tokenizers` and saved as PreTrainedTokenizerFast, which transformers 4 and 5 load alike."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = [*SPECIALS, *(f"w{i}" for i in range(FIRST_WORD, vocab_size))]
    tokenizer = Tokenizer(models.WordPiece({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_length,
                            model_input_names=["input_ids", "token_type_ids", "attention_mask"]).save_pretrained(path)
    # transformers 5 names its own backend class in the config, which transformers 4 (the peers' environments)
    # does not know; the fast class's old name loads under both.
    config = path / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"},
                                 indent=2))


def texts(ids: torch.Tensor, mask: torch.Tensor, query: int) -> tuple[str, list[str]]:
    """The query and each row's document as text, from rows laid out by `Case` for reranking."""
    def words(tokens: torch.Tensor) -> str:
        return " ".join(f"w{int(t)}" for t in tokens)

    lengths = mask.sum(dim=1).tolist()
    return words(ids[0, 1:1 + query]), [words(ids[row, query + 2:length - 1]) for row, length in enumerate(lengths)]
