"""RoBERTa: BERT's layers with positions counted from `pad_token_id + 1`, skipping padding tokens.

XLM-RoBERTa is the same architecture under its own model_type (a larger vocabulary, the same `roberta.`
checkpoint prefix), so it is a second family over the same module."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.models.bert import BertEmbeddings, BertEncoder, bert_dims
from hotrod.models.heads import ProjectedClassifier, SpladeHead
from hotrod.registry import Dims, Family, register
from hotrod.tasks.constants import CLASSIFY, SPARSE


class RobertaEmbeddings(BertEmbeddings):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = config.pad_token_id

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        real = input_ids.ne(self.padding_idx).to(torch.long)
        return torch.cumsum(real, dim=1) * real + self.padding_idx


class RobertaEncoder(BertEncoder):
    embeddings_class = RobertaEmbeddings
    checkpoint_prefixes = ("roberta.",)


def roberta_dims(config) -> Dims:
    # Positions start after the padding index, so two fewer tokens fit than the table has rows.
    dims = bert_dims(config)
    return dataclasses.replace(dims, max_positions=config.max_position_embeddings - config.pad_token_id - 1)


class _LMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # tied to the word embeddings
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.act = ACT2FN["gelu"]  # RobertaLMHead's and MPNetLMHead's own, whatever the config's hidden_act


class LMHeadSplade(SpladeHead):
    """RobertaForMaskedLM's head (`lm_head`: dense, GELU, layer_norm, decoder + bias), which XLM-R's and
    MPNet's masked-LM heads share, run as SPLADE (`SpladeHead`)."""

    def __init__(self, config):
        super().__init__(config, "lm_head.decoder.weight")
        self.lm_head = _LMHead(config)

    def logits(self, hidden):
        head = self.lm_head
        return head.decoder(head.layer_norm(head.act(head.dense(hidden)))) + head.bias


HEADS = {CLASSIFY: ProjectedClassifier, SPARSE: LMHeadSplade}  # RoBERTa's and XLM-R's heads
FAMILY = register(
    Family(name="roberta", model_types=("roberta",), kind="encoder", sizes=roberta_dims, build=RobertaEncoder,
           onnx_optimizer="bert", heads=HEADS)
)
XLM_ROBERTA = register(
    Family(name="xlm-roberta", model_types=("xlm-roberta",), kind="encoder", sizes=roberta_dims,
           build=RobertaEncoder, onnx_optimizer="bert", heads=HEADS)
)
