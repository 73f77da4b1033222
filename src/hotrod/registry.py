"""Families, keyed by Hugging Face `model_type`: the registry each `hotrod.models` module adds itself to.

A family is the only place that knows an architecture: how to build its lean module from a config,
how to map checkpoint weights onto it, its dimensions and its own task heads. Generic code asks the
registry (through `hotrod.models.get_family`, which registers every family first), never
`if model_type == ...`. The three *kinds* (encoder, decoder, seq2seq) are generic contracts: which
graphs exist and what their inputs and outputs are called (see `hotrod.contracts`). A family has a kind of
its own, and may run a task of another kind whole through a head of its own (BART's sequence classification:
the encoder-decoder as the encoder kind's one graph), so a model's kind is `Family.kind_of(config)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import nn

Kind = Literal["encoder", "decoder", "seq2seq"]


@dataclass(frozen=True)
class Dims:
    """The sizes generic code needs: graph IO shapes, cache sizes, input validation."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    max_positions: int | None  # None: relative positions, no hard limit
    num_decoder_layers: int = 0  # seq2seq only
    type_vocab_size: int = 0  # encoders with token type embeddings
    task: str = ""  # what the graphs end in (`hotrod.tasks`): an encoder's head decides its outputs
    num_labels: int = 0  # outputs per row or token of a labelled head

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Family:
    """What hotrod knows about one architecture."""

    name: str
    model_types: tuple[str, ...]
    kind: Kind  # its own (the bare model's); a model's is `kind_of(config)`, which its task may change
    sizes: Callable[[object], Dims]  # config -> the architecture's sizes (`dims` adds the task's)
    build: Callable[[object], nn.Module]  # config -> lean module with `graphs()` and `load_hf()`
    # The tasks it runs (`hotrod.tasks`), the bare model's first; empty: every task of its kind it has a head
    # for (`hotrod.tasks.family_tasks`).
    tasks: tuple[str, ...] = ()
    # task -> its own head; a head for a task of another kind runs that task as that kind (`kind_of`)
    heads: Mapping[str, Callable[[object], nn.Module]] | None = field(default=None, compare=False)
    onnx_optimizer: str | None = None  # model type for ONNX Runtime's transformer optimizer (fusion)
    # Operators this family's graphs keep in fp32 under fp16/bf16, beyond the list every graph keeps
    # (`hotrod.optimize.mixed.KEEP_FP32_OPS`); each graph carries them in its metadata.
    fp32_ops: tuple[str, ...] = ()

    def dims(self, config) -> Dims:
        """The sizes of `config`'s model with its task (`hotrod.tasks.task_of`): the head shapes the graphs."""
        from hotrod.tasks import label_count, task_of

        task = task_of(config, self)
        return dataclasses.replace(self.sizes(config), task=task, num_labels=label_count(config, task))

    def kind_of(self, config) -> Kind:
        """The kind `config`'s model runs as, the one its graphs, runtime and server follow: the family's own,
        unless its task (`hotrod.tasks.task_of`) is one of another kind, which the family runs through a
        head of its own as that task's kind (BART's text classification: one encoder-kind graph)."""
        from hotrod.tasks import get, task_of

        kinds = get(task_of(config, self)).kinds
        return self.kind if self.kind in kinds else kinds[0]


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    for model_type in family.model_types:
        if model_type in _FAMILIES:
            raise RuntimeError(f"model_type {model_type!r} registered twice")
        _FAMILIES[model_type] = family
    return family


def registered(model_type: str) -> Family | None:
    """The family registered for `model_type`, if any (`hotrod.models.get_family` registers them all first)."""
    return _FAMILIES.get(model_type)


def registered_families() -> list[Family]:
    """Each registered family once, in registration order."""
    return list({f.name: f for f in _FAMILIES.values()}.values())
