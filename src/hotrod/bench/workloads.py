"""The workloads of benchmarks/WORKLOADS.md, defined in code.

Speed does not depend on weight values, so each workload builds its architecture with seeded random
weights (transformers' own initialisation) and saves it as an ordinary checkpoint; generation length is
forced with min_new_tokens = max_new_tokens so that no early EOS shortens a run. The encoder-decoder
checkpoints (W10, W11) are built with none of the generation settings their real counterparts carry
(forced first and last tokens, no-repeat n-grams, length penalties: `PLAIN_SEARCH`), so every system, each
told the same search explicitly (`hotrod.bench.case.Case.generate_kwargs`), searches the same way.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hotrod.source import cache_dir


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config())


def _t5_small():
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, eos_token_id=1))


def _bert_base():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig())


def _bert_large_squad():
    """W6: BERT-large's shape with a span head, as the SQuAD checkpoints are. PyTorch eager is the baseline
    and ONNX Runtime peers would be hotrod's own graphs; OpenVINO runs it as optimum-intel's
    OVModelForQuestionAnswering, with the same span search on its logits."""
    from transformers import BertConfig, BertForQuestionAnswering

    return BertForQuestionAnswering(BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                               intermediate_size=4096))


# Off on both sides: the settings a BART or Marian checkpoint's config may carry that change a search
# (bart-large-cnn forces BOS and EOS; Marian's configs force EOS). The real checkpoints' generation configs
# are not wanted here: their weights are random, and CTranslate2 would be told none of it.
PLAIN_SEARCH = {"forced_bos_token_id": None, "forced_eos_token_id": None}


def marian_en_de_config():
    """W10: Marian OPUS-MT en-de's shape (Helsinki-NLP/opus-mt-en-de's config): sinusoidal positions, swish,
    scaled embeddings, one vocabulary shared by the encoder, the decoder and the tied head, whose last id is
    the pad token the decoder starts from. The real checkpoint also bans that token (bad_words_ids), which
    would send the others' greedy steps down their constrained paths; here its embedding row, which the tied
    head reads, is zero (transformers zeroes a padding row), so its logit is 0, in the middle of the others'
    and far below the best few a search keeps: CTranslate2, which drops the token from its vocabulary, and
    the others search over the same candidates."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=58101, decoder_vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
        max_position_embeddings=512, activation_function="swish", scale_embedding=True, pad_token_id=58100,
        decoder_start_token_id=58100, eos_token_id=0, bos_token_id=None, share_encoder_decoder_embeddings=True,
        **PLAIN_SEARCH)


def bart_large_cnn_config():
    """W11: bart-large-cnn's shape (`BartConfig()` with its 50264-word vocabulary), without its generation
    settings (forced BOS and EOS, no_repeat_ngram_size 3, length_penalty 2, min and max lengths)."""
    from transformers import BartConfig

    return BartConfig(vocab_size=50264, **PLAIN_SEARCH)


def _marian_en_de():
    from transformers import MarianMTModel

    return MarianMTModel(marian_en_de_config())


def _bart_large_cnn():
    from transformers import BartForConditionalGeneration

    return BartForConditionalGeneration(bart_large_cnn_config())


def _minilm_cross_encoder():
    """W7: a cross-encoder of MiniLM-L6's shape (ms-marco-MiniLM-L6-v2's): one relevance score per pair."""
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                                    intermediate_size=1536, num_labels=1))


@dataclass(frozen=True)
class Shape:
    """One case of a workload that has several (W10), named `<workload>-<suffix>`: its rows and its beams."""

    suffix: str
    lengths: tuple[int, ...]
    num_beams: int = 1


@dataclass(frozen=True)
class Workload:
    id: str
    description: str
    build: Callable[[], torch.nn.Module] = field(repr=False)
    task: str  # "generate" or "forward"
    lengths: tuple[int, ...]  # prompt length of each row of the batch
    new_tokens: int = 0
    accuracy_model: str = ""  # the trained demo model of the same family, on which precisions are judged
    head: str | None = None  # the encoder's head (`hotrod.tasks`), timed with what follows it (span search)
    batches: tuple[int, ...] = ()  # the rows repeated to each batch size, one case each (W6); () : as given
    query: int = 0  # reranking: query tokens, each row being [CLS] query [SEP] document [SEP]
    num_beams: int = 1  # generation: 1 greedy, else beam search of that width
    shapes: tuple[Shape, ...] = ()  # the cases, where a workload has several of its own (W10); () : as above


def _w4_lengths() -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(4)
    return tuple(int(n) for n in torch.randint(16, 129, (16,), generator=generator))


def _w10_lengths() -> tuple[int, ...]:
    """W10's batch: 16 sources of 8..64 tokens, seeded as W4's lengths are."""
    generator = torch.Generator().manual_seed(10)
    return tuple(int(n) for n in torch.randint(8, 65, (16,), generator=generator))


W7_QUERY = 12  # query tokens


def _w7_lengths(documents: int = 100) -> tuple[int, ...]:
    """Each pair's length: the query, documents of 32..128 tokens, and [CLS] [SEP] [SEP]."""
    generator = torch.Generator().manual_seed(7)
    return tuple(W7_QUERY + 3 + int(n) for n in torch.randint(32, 129, (documents,), generator=generator))


WORKLOADS: dict[str, Workload] = {
    w.id: w
    for w in (
        Workload("W1", "GPT-2 124M, batch 1, 32-token prompt, 64 new tokens, greedy", _gpt2, "generate", (32,), 64,
                 "gpt2-numbers"),
        Workload("W2", "t5-small shape, batch 1, 32 input tokens, 64 new tokens, greedy", _t5_small, "generate", (32,),
                 64, "t5-dates"),
        Workload("W3", "bert-base, batch 1, 128 tokens, forward", _bert_base, "forward", (128,),
                 accuracy_model="all-minilm-l6-v2"),
        Workload("W4", "bert-base, batch 16, lengths uniform in 16..128, forward", _bert_base, "forward", _w4_lengths(),
                 accuracy_model="all-minilm-l6-v2"),
        Workload("W6", "BERT-large SQuAD shape, question answering at 384 tokens, forward and span search",
                 _bert_large_squad, "forward", (384,), head="question-answering", batches=(1, 8)),
        Workload("W7", "cross-encoder reranking, MiniLM-L6 shape: one query and 100 documents of 32..128 tokens",
                 _minilm_cross_encoder, "forward", _w7_lengths(), accuracy_model="minilm-intents",
                 head="text-classification", query=W7_QUERY),
        Workload("W10", "translation, Marian OPUS-MT en-de shape: 32-token source, 48 new tokens, greedy and beam 4; "
                 "batch 16 of 8..64 tokens, greedy", _marian_en_de, "generate", (32,), 48,
                 shapes=(Shape("greedy", (32,)), Shape("beam4", (32,), 4), Shape("b16", _w10_lengths()))),
        Workload("W11", "summarization, BART-large-cnn shape: 512-token article, 64 new tokens, beam 4",
                 _bart_large_cnn, "generate", (512,), 64, num_beams=4),
    )
}


def checkpoint(workload: Workload, root: Path | None = None) -> Path:
    """The workload's seeded random checkpoint, built once and kept under the hotrod cache: built in a folder
    beside it and renamed into place when whole, so an interrupted build is built again, never read half."""
    root = root or cache_dir() / "workloads"
    path = root / workload.id
    if path.is_dir() and not ((path / "config.json").is_file() and any(path.glob("*.safetensors"))):
        shutil.rmtree(path)  # an earlier build cut short before this one renamed its folders into place
    if not path.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=root, prefix=f".{workload.id}-"))
        try:
            torch.manual_seed(0)
            model = workload.build().eval()
            model.save_pretrained(partial)
            if workload.query:  # the reranking peers take text: a tokenizer over the bench's word vocabulary
                from hotrod.bench.vocab import save_tokenizer

                save_tokenizer(partial, model.config.vocab_size, model.config.max_position_embeddings)
            partial.rename(path)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return path
