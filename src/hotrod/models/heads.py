"""Task heads shared by the encoder families: each one ends an encoder graph in what its task returns.

A head's submodules carry the names the checkpoint gives them at its top level (`classifier`,
`pooler.dense`, `qa_outputs`, ...), so a family's head is only a choice among these blocks and its weights
load unchanged (`load_with_head`). Every head takes the last hidden state [B, S, H] and the attention mask
and returns the task's outputs (`hotrod.contracts`): logits [B, labels] for sequence classification,
[B, S, labels] for token classification, (start, end) logits [B, S] for question answering. Dropout is
left out: the graphs are for inference only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.errors import HotrodError
from hotrod.models.common import load_weights, strip_prefix
from hotrod.tasks import ANSWER, CLASSIFY, FEATURES, TOKENS, task_of

Head = Callable[[object], nn.Module]  # config -> head module


class _Dense(nn.Module):
    """A projection of the first token and its activation (`dense`): BERT's pooler, the RoBERTa head's."""

    def __init__(self, config, activation: str):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[activation]

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(first))


class PooledClassifier(nn.Module):
    """BERT's: `pooler` (dense + tanh on [CLS]), then `classifier`."""

    def __init__(self, config):
        super().__init__()
        self.pooler = _Dense(config, "tanh")
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden, attention_mask):
        return self.classifier(self.pooler(hidden[:, 0]))


class PreClassifier(nn.Module):
    """DistilBERT's: `pre_classifier` and ReLU on the first token, then `classifier`."""

    def __init__(self, config):
        super().__init__()
        self.pre_classifier = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden, attention_mask):
        return self.classifier(torch.relu(self.pre_classifier(hidden[:, 0])))


class _OutProjection(nn.Module):
    def __init__(self, config, activation: str):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[activation]
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.act(self.dense(first)))


class ProjectedClassifier(nn.Module):
    """RoBERTa's and XLM-R's (tanh) and ELECTRA's (GELU): `classifier.dense` on the first token, then
    `classifier.out_proj`."""

    def __init__(self, config, activation: str = "tanh"):
        super().__init__()
        self.classifier = _OutProjection(config, activation)

    def forward(self, hidden, attention_mask):
        return self.classifier(hidden[:, 0])


class TokenClassifier(nn.Module):
    """`classifier` on every token."""

    def __init__(self, config):
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden, attention_mask):
        return self.classifier(hidden)


class SpanClassifier(nn.Module):
    """`qa_outputs` on every token, split into start and end logits."""

    def __init__(self, config):
        super().__init__()
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, hidden, attention_mask):
        start, end = self.qa_outputs(hidden).unbind(dim=-1)
        return start, end


def build_head(config, heads: dict[str, Head]) -> nn.Module | None:
    """The head `config`'s task asks for from the family's table (`heads`), or None for the bare encoder."""
    from hotrod.registry import get_family

    family = get_family(config.model_type)
    task = task_of(config, family)
    if task == FEATURES:
        return None
    if task not in heads:
        raise HotrodError(f"hotrod's {family.name} family has no {task} head")
    return heads[task](config)


STANDARD_HEADS: dict[str, Head] = {CLASSIFY: PooledClassifier, TOKENS: TokenClassifier, ANSWER: SpanClassifier}


def load_with_head(module: nn.Module, state_dict: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> None:
    """Load an encoder and its head (`module.head`): checkpoint names outside the backbone's submodules are
    the head's. A head whose size differs from the label map is one line saying so."""
    state = strip_prefix(state_dict, prefixes)
    backbone = {name for name, _ in module.named_children() if name != "head"}
    mapped = {key if key.split(".")[0] in backbone else f"head.{key}": value for key, value in state.items()}
    own = module.state_dict()
    for name, tensor in own.items():
        source = mapped.get(name)
        if name.startswith("head.") and source is not None and source.shape != tensor.shape:
            raise HotrodError(f"the checkpoint's head weight {name[5:]} has shape {tuple(source.shape)}, but its "
                              f"config's label map (num_labels {module.num_labels}) makes it {tuple(tensor.shape)}")
    load_weights(module, mapped)
