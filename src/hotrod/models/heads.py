"""Task heads that several encoder families have in place of a task's standard one (`hotrod.tasks`), and
how an encoder's checkpoint loads with its head.

A head's submodules carry the names the checkpoint gives them at its top level (`classifier`,
`pre_classifier`, ...), so its weights load unchanged (`load_with_head`). Every head takes the last hidden
state [B, S, H] and the attention mask and returns the task's outputs (its spec's `outputs`). Dropout is
left out: the graphs are for inference only.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from hotrod.errors import HotrodError
from hotrod.models.common import load_weights, strip_prefix
from hotrod.pipelines.splade import config_settings


class _Dense(nn.Module):
    """A projection of the first token and its activation (`dense`): BERT's pooler, the RoBERTa head's."""

    def __init__(self, config, activation: str):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[activation]

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(first))


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


def load_with_head(module: nn.Module, state_dict: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> None:
    """Load an encoder and its head (`module.head`): checkpoint names outside the backbone's submodules are
    the head's. A head whose size differs from the label map is one line saying so, and so is a head's weights
    left unused because the config names no head (`module.unnamed_heads`, `hotrod.tasks.unnamed_heads`)."""
    state = strip_prefix(state_dict, prefixes)
    backbone = {name for name, _ in module.named_children() if name != "head"}
    mapped = {key if key.split(".")[0] in backbone else f"head.{key}": value for key, value in state.items()}
    for name, source in getattr(module.head, "tied", {}).items():  # a tied decoder: the word embeddings
        if source in mapped:
            mapped[f"head.{name}"] = mapped[source]
    own = module.state_dict()
    if getattr(module, "unnamed_heads", None) is not None:  # a config naming no head: is one in the weights?
        module.unnamed_heads.check({key[5:] for key in mapped if key.startswith("head.") and key not in own})
    for name, tensor in own.items():
        source = mapped.get(name)
        if name.startswith("head.") and source is not None and source.shape != tensor.shape:
            raise HotrodError(f"the checkpoint's head weight {name[5:]} has shape {tuple(source.shape)}, but its "
                              f"config's label map (num_labels {module.num_labels}) makes it {tuple(tensor.shape)}")
    load_weights(module, mapped)


class SpladeHead(nn.Module):
    """sparse-embedding's head over a family's masked-LM head (`logits`, its submodules named as the
    checkpoint names them): sentence-transformers' SpladePooling in the graph, so the [batch, sequence, vocab]
    logits never leave it. Each vocabulary entry's weight is the max (or sum) over the real tokens of
    log(1 + relu(logit)), with a second log1p for the `log1p_relu` activation (the config's SpladePooling
    settings, `hotrod.pipelines.splade`). `tied` maps the decoder's weight to the word embeddings where the
    config ties them, as transformers loads them (its checkpoints leave the copy out)."""

    def __init__(self, config, decoder: str, embeddings: str = "embeddings.word_embeddings.weight"):
        super().__init__()
        self.strategy, self.activation = config_settings(config)
        tied = getattr(config, "tie_word_embeddings", True)
        self.tied = {decoder: embeddings} if tied else {}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, hidden, attention_mask):
        logits = self.logits(hidden) * attention_mask.unsqueeze(-1).to(hidden.dtype)  # padding: log1p(relu(0)) = 0
        if self.strategy == "max":  # log1p and relu rise with their input: the max goes first, over [B, V]
            weights = torch.log1p(torch.relu(logits.max(dim=1).values))
        else:
            weights = torch.log1p(torch.relu(logits))
        if self.activation == "log1p_relu":
            weights = torch.log1p(weights)
        return weights if self.strategy == "max" else weights.sum(dim=1)
