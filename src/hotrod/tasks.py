"""Tasks: what a checkpoint's head does, read from its `architectures` or told with `--task`.

A Hugging Face checkpoint names its head in the class it was saved from (`BertForSequenceClassification`,
`XLMRobertaForTokenClassification`, ...): the suffix is the task, whatever the family, so this table is
generic. A family says which tasks it runs (`hotrod.registry.Family.tasks`); any other head is refused in
one line that names it, never dropped. `--task` (`task=` in Python) overrides the checkpoint's own, as
optimum-cli's does; hotrod records it in the artifact's config under `TASK_KEY`, so the artifact reads back
as the task it was built for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hotrod.errors import HotrodError

if TYPE_CHECKING:
    from hotrod.registry import Family

FEATURES = "feature-extraction"  # the bare encoder: last hidden state (embeddings)
CLASSIFY = "text-classification"  # sequence classification, regression, cross-encoder reranking
TOKENS = "token-classification"  # NER, POS
ANSWER = "question-answering"  # extractive: start and end logits
GENERATE = "text-generation"
TEXT2TEXT = "text2text-generation"
ENCODER_TASKS = (FEATURES, CLASSIFY, TOKENS, ANSWER)
TASKS = (*ENCODER_TASKS, GENERATE, TEXT2TEXT)
LABELLED = (CLASSIFY, TOKENS)  # tasks whose outputs are the config's labels (id2label)
TASK_KEY = "hotrod_task"

# Class-name suffixes, longest first where one ends another ("LMHeadModel" before "Model").
_SUFFIXES = (
    ("ForSequenceClassification", CLASSIFY),
    ("ForTokenClassification", TOKENS),
    ("ForQuestionAnswering", ANSWER),
    ("ForConditionalGeneration", TEXT2TEXT),
    ("LMHeadModel", GENERATE),
    ("ForCausalLM", GENERATE),
    ("Model", None),  # the bare model: the family's own task
)


def task_of(config, family: Family) -> str:
    """The task `config` asks of `family`: told (`TASK_KEY`), else its first architecture's head, else the
    family's own. A head the family does not run is refused, named."""
    told = getattr(config, TASK_KEY, None)
    if told:
        return check_task(told, family)
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        return family.tasks[0]
    head = str(architectures[0])
    for suffix, task in _SUFFIXES:
        if head.endswith(suffix):
            task = task or family.tasks[0]
            if task in family.tasks:
                return task
            break
    raise HotrodError(
        f"the checkpoint's head {head} is not supported by hotrod's {family.name} family, which runs "
        f"{', '.join(family.tasks)}; pass --task (task=) to choose one"
        + (f" ({FEATURES} runs the bare encoder without the head)" if FEATURES in family.tasks else "")
    )


def check_task(task: str, family: Family) -> str:
    """`task` if `family` runs it; else one line naming what it runs."""
    if task not in family.tasks:
        raise HotrodError(f"unknown task {task!r} for {family.name}; it runs {', '.join(family.tasks)}")
    return task


def label_count(config, task: str) -> int:
    """How many outputs the head has per row (or per token): the label map's size, for labelled tasks."""
    if task not in LABELLED:
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
    if task not in LABELLED:
        return {}
    id2label = getattr(config, "id2label", None) or {}
    return {int(i): str(name) for i, name in id2label.items()}
