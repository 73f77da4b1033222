"""The workloads of benchmarks/WORKLOADS.md, defined in code.

Speed does not depend on weight values, so each workload builds its architecture with seeded random
weights (transformers' own initialisation) and saves it as an ordinary checkpoint; generation length is
forced with min_new_tokens = max_new_tokens so that no early EOS shortens a run.
"""

from __future__ import annotations

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


def _minilm_cross_encoder():
    """W7: a cross-encoder of MiniLM-L6's shape (ms-marco-MiniLM-L6-v2's): one relevance score per pair."""
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                                    intermediate_size=1536, num_labels=1))


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


def _w4_lengths() -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(4)
    return tuple(int(n) for n in torch.randint(16, 129, (16,), generator=generator))


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
    )
}


def checkpoint(workload: Workload, root: Path | None = None) -> Path:
    """The workload's seeded random checkpoint, built once and kept under the hotrod cache."""
    root = root or cache_dir() / "workloads"
    path = root / workload.id
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        model = workload.build().eval()
        model.save_pretrained(path)
        if workload.query:  # the reranking peers take text: a tokenizer over the bench's word vocabulary
            from hotrod.bench.vocab import save_tokenizer

            save_tokenizer(path, model.config.vocab_size, model.config.max_position_embeddings)
    return path
