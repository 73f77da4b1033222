"""The workloads of WORKLOADS.md, defined in code.

Speed does not depend on weight values, so each workload builds its architecture with seeded random
weights (transformers' own initialisation) and saves it as an ordinary checkpoint; generation length is
forced with min_new_tokens = max_new_tokens so that no early EOS shortens a run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hotrod.load import cache_dir


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config())


def _t5_small():
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, eos_token_id=1))


def _bert_base():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig())


@dataclass(frozen=True)
class Workload:
    id: str
    description: str
    build: Callable[[], torch.nn.Module] = field(repr=False)
    task: str  # "generate" or "forward"
    lengths: tuple[int, ...]  # prompt length of each row of the batch
    new_tokens: int = 0
    accuracy_model: str = ""  # the trained demo model of the same family, on which precisions are judged


def _w4_lengths() -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(4)
    return tuple(int(n) for n in torch.randint(16, 129, (16,), generator=generator))


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
    return path
