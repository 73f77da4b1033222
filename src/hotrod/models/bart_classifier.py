"""BART's and mBART's sequence classification (facebook/bart-large-mnli, the zero-shot model people run): the
whole encoder-decoder as the encoder kind's one graph, (input_ids, attention_mask) -> logits.

transformers' ...ForSequenceClassification runs the encoder, then the decoder over the same ids shifted right
(BART: its start token first; mBART: the last token wrapped round, `Layout.decoder_inputs`), with no decoder
mask but the causal one, and reads the decoder's last hidden state at each row's last EOS into
`classification_head` (dense, tanh, out_proj; dropout off). Nothing is cached and nothing is generated, so
the seq2seq kind's three graphs have no use here: one graph over the stack without its LM head is what the
text-classification task's contract asks (`hotrod.contracts.encoder_io`), and its pipelines (classify,
zero-shot) run it as they run any encoder's head. The family names this head for the task (`Family.heads`),
and the registry runs a family's task of another kind as that kind (`Family.kind_of`).

Rows are right-padded after their last EOS, and the decoder is causal: the pad positions never reach the one
read, so a row's logits do not depend on the batch it runs in. transformers insists every row holds as many
EOS; each row's own last EOS is the same position then, and needs no such rule here.
"""

from __future__ import annotations

import torch
from torch import nn

from hotrod.models.bart_stack import HEAD_PREFIX, BartLikeModel, Layout
from hotrod.models.common import load_weights
from hotrod.registry import registered
from hotrod.tasks import build_head, unnamed_heads


class ClassificationHead(nn.Module):
    """BartClassificationHead: `dense` and tanh, then `out_proj`, on one hidden state a row."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(hidden)))


def last_eos(input_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """[B]: the position of each row's last EOS (0 where a row has none). A max of the positions where the
    id is EOS, which exports as one ReduceMax (ONNX Runtime's ArgMax takes no integers)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    return ((input_ids == eos_token_id).long() * positions).amax(dim=1)


class EosClassifier(nn.Module):
    """(input_ids, attention_mask) -> logits [B, num_labels]; weights named as the checkpoint names them
    (`model.` for the stack, `classification_head.`)."""

    def __init__(self, config, layout: Layout, head: nn.Module):
        super().__init__()
        self.config = config
        self.model = BartLikeModel(config, layout, lm_head=False)
        self.classification_head = head

    def forward(self, input_ids, attention_mask):
        model = self.model
        hidden = model.encode(input_ids, attention_mask)
        decoder_ids = model.layout.decoder_inputs(input_ids, self.config)
        states, _ = model.decoder_states(decoder_ids, attention_mask, model.cross_kv(hidden))
        index = last_eos(input_ids, self.config.eos_token_id)[:, None, None].expand(-1, 1, states.shape[-1])
        return self.classification_head(states.gather(1, index).squeeze(1))

    def graphs(self) -> dict[str, nn.Module]:
        return {"encoder": self}

    def load_hf(self, state_dict: dict[str, torch.Tensor]) -> None:
        head = {k.removeprefix(HEAD_PREFIX): v for k, v in state_dict.items() if k.startswith(HEAD_PREFIX)}
        self.model.load_hf({k: v for k, v in state_dict.items() if not k.startswith(HEAD_PREFIX)})
        load_weights(self.classification_head, head)


def build(config, layout: Layout) -> nn.Module:
    """The module `config`'s task asks of a BART-like family: the generating stack, or, where the family has a
    head for the task (`Family.heads`), the whole model ending in it."""
    family = registered(config.model_type)
    head = build_head(config, family)
    if head is not None:
        return EosClassifier(config, layout, head)
    model = BartLikeModel(config, layout)
    model.unnamed_heads = unnamed_heads(config, family)  # its `load_hf` asks: a classifier's weights, unnamed?
    return model
