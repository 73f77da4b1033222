"""Tasks, each one declarative spec: what a checkpoint's head does, and everything hotrod does with it.

As Optimum's TasksManager maps a task to its head and outputs, a `TaskSpec` owns, in one place: the head
class suffixes it reads from a checkpoint's `architectures`, its graph outputs (the contracts and the Open
Inference Protocol's tensors are derived from them), its standard head module, its prepare/finish pipeline
(`hotrod.pipelines`), its verification measure, its CLI subcommand and its HTTP route. The model API, the
CLI, the server, verification, calibration and `--precision auto` iterate over specs; nothing outside this
package compares a task's name. Adding a task is a spec (one module in this package, found on import), a
pipeline and their tests.

A variant (reranking, zero-shot classification) is a narrower use of another task's models: the same head
and graphs, its own pipeline, measure, command and route, for the models its `fits` accepts by their label
count (a one-label classifier) and its `fits_labels` by their labels' names (an NLI head's entailment).

`--task` (`task=` in Python) overrides the checkpoint's own head, as optimum-cli's does; hotrod records it
in the artifact's config under `TASK_KEY`, so the artifact reads back as the task it was built for.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotrod.errors import HotrodError

if TYPE_CHECKING:
    from hotrod.registry import Dims, Family

TASK_KEY = "hotrod_task"


@dataclass(frozen=True)
class Output:
    """One graph output of a head. Axes are symbolic where they vary or depend on the model: batch,
    sequence, labels (the label map's size), hidden (the hidden size), vocab (the vocabulary's size); or a
    number."""

    name: str
    axes: tuple[str | int, ...]

    @property
    def per_token(self) -> bool:
        return "sequence" in self.axes

    def shape(self, dims: Dims) -> tuple[str | int, ...]:
        """The axes with the model's sizes put in (batch and sequence stay symbolic)."""
        sizes = {"labels": dims.num_labels, "hidden": dims.hidden_size, "vocab": dims.vocab_size}
        return tuple(sizes.get(a, a) if isinstance(a, str) else a for a in self.axes)


@dataclass(frozen=True)
class Command:
    """A task's `hotrod` subcommand: `arguments` adds its own to the parser (beside the model, --json and the
    runtime options), `call` answers with the loaded model, `show` prints an answer as lines of text."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    call: Callable[[Any, argparse.Namespace], Any]
    show: Callable[[argparse.Namespace, Any], Iterable[str]]
    truncate: bool = True  # takes --truncate


@dataclass(frozen=True)
class Door:
    """What a route checks of a request before any tokenizing: `count` inputs (at most `most`, or the server's
    limit) under `param`, and each (where, text) a non-empty string short enough unless it is truncated."""

    param: str
    count: int
    texts: Sequence[tuple[str, Any]]
    truncate: bool = False
    most: int | None = None
    other: Sequence[tuple[str, Any, bool]] = ()  # (param, [(where, text)], truncate): further fields' texts


@dataclass(frozen=True)
class Route:
    """A task's HTTP route, served by `hotrod.serve.task_routes` over the task's pipeline. `schemas` makes the
    (request, response) pydantic models when a server is built (pydantic is the server's dependency);
    `door` reads what is checked before tokenizing; `arguments` gives the pipeline's `prepare` arguments
    after the model; `respond` builds the response body from the answer and a `Reply`."""

    path: str
    endpoint: str  # its name in the server's metrics
    schemas: Callable[[], tuple[type, type]]
    door: Callable[[Any], Door]
    arguments: Callable[[Any], tuple]
    respond: Callable[[Any, Any, Any], Any]
    check: Callable[[Any, Any], None] | None = None  # (body, limits) -> None, or ValueError("param: message")
    fields: tuple[str, ...] = ()  # a prepare refusal that begins with one of these names is about that field
    bounded_rows: bool = True  # each row within the server's input limit (else the request sizes its rows)
    many: str = "inputs"  # what its rows are, in the refusal of more than a request may run


@dataclass(frozen=True)
class Bench:
    """How `hotrod bench` runs a head in transformers and compares the systems' answers: `auto_class` is
    transformers' auto class of the head, `answer` makes what is compared of a forward's output (and the
    mask), `agreement` the share of two systems' answers that agree (ours, theirs, the mask)."""

    auto_class: str
    answer: Callable[[Any, Any], Any]
    agreement: Callable[[Any, Any, Any], float]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kinds: tuple[str, ...]  # the model kinds (`hotrod.kinds`) that run it
    heads: tuple[str, ...] = ()  # class-name suffixes of `architectures` that name it
    bare: bool = False  # the task of a bare checkpoint ("...Model") of its kinds
    outputs: tuple[Output, ...] = ()  # an encoder graph's outputs
    head: Callable[[Any], Any] | None = None  # config -> its standard head module (families may have their own)
    labelled: bool = False  # its outputs are the config's labels (id2label)
    embeds: bool = False  # its models have embeddings (`HotrodModel.embed`)
    method: str | None = None  # the HotrodModel method that runs it through `pipeline`
    pipeline: Any = None  # a module with prepare(model, ...) -> Prepared and finish(model, prepared, outputs)
    measure: Any = None  # its verification measure (`hotrod.verification.measures.Measure`)
    command: Command | None = None
    route: Route | None = None
    bench: Bench | None = None
    variant_of: str | None = None  # the task whose models a variant runs on
    fits: Callable[[int], bool] | None = None  # which of those models a variant takes, by their label count
    fits_labels: Callable[[Sequence[str]], bool] | None = None  # ... and by their labels' names, where known
    needs: str = ""  # what a variant's model must be, said when one does not fit
    # What a checkpoint's own files beside config.json say (a SparseEncoder's modules.json): None where they do
    # not ask for this task, else the config attributes they set (its head's settings); `read_files` asks.
    files: Callable[[Path], dict[str, Any] | None] | None = None
    summary: str = field(default="", compare=False)  # one line for tables and help

    @property
    def base(self) -> str:
        """The task a model of this spec is built for."""
        return self.variant_of or self.name

    def refusal(self, task: str | None, label_count: int, call: str | None = None,
                names: Sequence[str] | None = None) -> str | None:
        """Why a model built for `task` with `label_count` labels (`names`, where the caller has them) cannot
        run this spec (asked for as `call`), or None when it can. A spec that reads the labels' names does
        not fit a model whose names are not given."""
        call = call or (f"{self.method}()" if self.method else self.name)
        if task != self.base:
            return f"{call} needs a {self.base} model; this one is built for {task or 'no task'}"
        if self.fits is not None and not self.fits(label_count):
            return f"{call} needs {self.needs}; this one has {label_count} labels"
        if self.fits_labels is not None and (names is None or not self.fits_labels(names)):
            said = f"labels are {', '.join(names)}" if names else "labels are not known"
            return f"{call} needs {self.needs}; this one's {said}"
        return None


_TASKS: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    """Add a task (or a variant); its name, method, command and route must be new."""
    for other in _TASKS.values():
        taken = [what for what, a, b in (("name", spec.name, other.name), ("method", spec.method, other.method),
                 ("command", _command(spec), _command(other)), ("route", _path(spec), _path(other))) if a and a == b]
        if taken:
            raise RuntimeError(f"task {spec.name!r}: its {taken[0]} is {other.name!r}'s already")
    if spec.variant_of is not None and spec.variant_of not in _TASKS:
        raise RuntimeError(f"task {spec.name!r} is a variant of {spec.variant_of!r}, which is not registered")
    _TASKS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Take a task out again (a test's toy task)."""
    _TASKS.pop(name, None)


def _command(spec: TaskSpec) -> str | None:
    return spec.command.name if spec.command else None


def _path(spec: TaskSpec) -> str | None:
    return spec.route.path if spec.route else None


def all_specs() -> list[TaskSpec]:
    return list(_TASKS.values())


def names(where: Callable[[TaskSpec], bool] = lambda spec: spec.variant_of is None) -> tuple[str, ...]:
    """The tasks `where` accepts (by default the ones models are built for), in registration order."""
    return tuple(name for name, spec in _TASKS.items() if where(spec))


def get(task: str) -> TaskSpec:
    spec = _TASKS.get(task)
    if spec is None:
        raise HotrodError(f"unknown task {task!r}; choose from {', '.join(names())}")
    return spec


def bare(kind: str) -> TaskSpec:
    """The task of a bare checkpoint of `kind` (the model without a head)."""
    return next(spec for spec in _TASKS.values() if spec.bare and kind in spec.kinds)


def by_method(method: str) -> TaskSpec | None:
    return next((spec for spec in _TASKS.values() if spec.method == method), None)


def of_model(task: str | None, label_count: int, names: Sequence[str] | None = None) -> TaskSpec | None:
    """The spec that says what a model built for `task` with `label_count` labels (named `names`) answers:
    a variant that fits it, else the task's."""
    variants = [s for s in _TASKS.values() if s.variant_of == task and (s.fits or s.fits_labels) is not None
                and s.refusal(task, label_count, names=names) is None]
    return variants[0] if variants else _TASKS.get(task or "")


def family_tasks(family: Family) -> tuple[str, ...]:
    """The tasks `family` runs: the ones it names, else every task of its kind that it has a head for
    (a standard head, or one of the family's own), and any task it has a head of its own for, which it runs
    as that task's kind (`Family.kind_of`); the bare model's first."""
    if family.tasks:
        return family.tasks
    own = family.heads or {}
    found = [s for s in _TASKS.values() if s.variant_of is None
             and (s.name in own or (family.kind in s.kinds and (s.bare or s.head is not None)))]
    return tuple(s.name for s in sorted(found, key=lambda s: not s.bare))


def task_of(config, family: Family) -> str:
    """The task `config` asks of `family`: told (`TASK_KEY`), else its first architecture's head, else the
    family's own. A head the family does not run is refused, named."""
    runs = family_tasks(family)
    told = getattr(config, TASK_KEY, None)
    if told:
        return check_task(told, family)
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        return runs[0]
    head = str(architectures[0])
    suffixes = sorted(((s, spec.name) for spec in _TASKS.values() for s in spec.heads), key=lambda p: -len(p[0]))
    task = next((name for suffix, name in suffixes if head.endswith(suffix)), None)
    if task is None and head.endswith("Model") and "Head" not in head:
        task = runs[0]  # the bare model: the family's own task (not GPT2DoubleHeadsModel, whose heads it has)
    if task in runs:
        return task
    bare = next((s.name for s in map(get, runs) if s.bare and not s.heads), None)
    raise HotrodError(
        f"the checkpoint's head {head} is not supported by hotrod's {family.name} family, which runs "
        f"{', '.join(runs)}; pass --task (task=) to choose one"
        + (f" ({bare} runs the bare encoder without the head)" if bare else "")
    )


def read_files(path: Path, config: Any) -> str | None:
    """The task a checkpoint's own files ask for (`TaskSpec.files`), its settings put on `config`: the task too,
    under `TASK_KEY`, unless the config names one already (an artifact built with --task). None if none asks."""
    for spec in _TASKS.values():
        settings = spec.files(path) if spec.files is not None else None
        if settings is not None:
            for key, value in settings.items():
                setattr(config, key, value)
            if not getattr(config, TASK_KEY, None):
                setattr(config, TASK_KEY, spec.name)
            return spec.name
    return None


def check_task(task: str, family: Family) -> str:
    """`task` if `family` runs it; else one line naming what it runs."""
    runs = family_tasks(family)
    if task not in runs:
        raise HotrodError(f"unknown task {task!r} for {family.name}; it runs {', '.join(runs)}")
    return task


def label_count(config, task: str) -> int:
    """How many outputs the head has per row (or per token): the label map's size, for labelled tasks."""
    if not get(task).labelled:
        return 0
    labels = getattr(config, "id2label", None) or {}
    count = int(getattr(config, "num_labels", len(labels)) or 0)
    if labels and len(labels) != count:
        raise HotrodError(f"the label map (id2label) names {len(labels)} labels but num_labels is {count}")
    if count < 1:
        raise HotrodError(f"a {task} head needs at least one label; the config has num_labels {count}")
    return count


def labels(config, task: str) -> dict[int, str]:
    """The label of each output index, for labelled tasks (empty otherwise)."""
    if not get(task).labelled:
        return {}
    id2label = getattr(config, "id2label", None) or {}
    return {int(i): str(name) for i, name in id2label.items()}


@dataclass(frozen=True)
class UnnamedHeads:
    """A config that names no head (no `architectures`, no task told) runs its family's bare task, `bare`;
    `heads` holds each head task the family runs with the names of its head's weights, so that a loader finding
    all of one task's among a checkpoint's unused tensors says so (`check`) where transformers' AutoModel would
    drop them with a warning."""

    bare: str
    heads: dict[str, frozenset[str]]

    def check(self, unused: set[str], prefix: str = "") -> None:
        """Refuse, in one line, unused tensors that hold the whole of a head this config does not name (`unused`
        named as the head names them; `prefix`: where the checkpoint keeps them, for the message)."""
        tasks = [task for task, names in self.heads.items() if names and names <= unused]
        if tasks:
            shown = [prefix + name for name in sorted(frozenset.intersection(*(self.heads[t] for t in tasks)))]
            raise HotrodError(
                f"the checkpoint holds the weights of a head ({', '.join(shown[:4])}{' ...' if len(shown) > 4 else ''})"
                f" but its config names no architectures, so the head would be dropped: pass --task (task=) "
                f"{' or '.join(tasks)} to run it, or {self.bare} for the bare model")


def unnamed_heads(config, family: Family) -> UnnamedHeads | None:
    """What a loader checks where `config` names no head (`UnnamedHeads`); None where it names one. The heads
    are built on the meta device, so asking costs no memory."""
    if getattr(config, TASK_KEY, None) or getattr(config, "architectures", None):
        return None
    import torch

    heads: dict[str, frozenset[str]] = {}
    for spec in map(get, family_tasks(family)):
        make = (family.heads or {}).get(spec.name) or spec.head
        if spec.heads and make is not None:
            with torch.device("meta"):
                heads[spec.name] = frozenset(make(config).state_dict())
    return UnnamedHeads(task_of(config, family), heads)


def build_head(config, family: Family):
    """The head module `config`'s task asks for (the family's own, else the task's standard one), or None
    for a task without a head (the bare encoder)."""
    task = task_of(config, family)
    spec = get(task)
    make = (family.heads or {}).get(task) or spec.head
    if make is not None:
        return make(config)
    if not spec.bare:
        raise HotrodError(f"hotrod's {family.name} family has no {task} head")
    return None
