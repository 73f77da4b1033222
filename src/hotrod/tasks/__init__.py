"""Tasks: one spec each (`registry.TaskSpec`), registered by the modules of this package.

Importing the package registers every built-in task, then any other module placed here: a new task is
one module that calls `register`, beside its pipeline in `hotrod.pipelines`.
"""

import importlib
import pkgutil

from hotrod.tasks.registry import (
    TASK_KEY,
    Bench,
    Command,
    Door,
    Output,
    Route,
    TaskSpec,
    all_specs,
    bare,
    build_head,
    by_method,
    check_task,
    family_tasks,
    get,
    label_count,
    labels,
    names,
    of_model,
    register,
    task_of,
    unnamed_heads,
    unregister,
)

# The built-in tasks in the order they are listed (the bare model's first); then any other module here.
_BUILT_IN = ("features", "classify", "tag", "answer", "rerank", "zero_shot", "generate")
_NOT_TASKS = {"constants", "registry"}
for _name in _BUILT_IN + tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                                      if m.name not in _BUILT_IN and m.name not in _NOT_TASKS)):
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["TASK_KEY", "Bench", "Command", "Door", "Output", "Route", "TaskSpec", "all_specs", "bare", "build_head", "by_method",
           "check_task", "family_tasks", "get", "label_count", "labels", "names", "of_model", "register", "task_of",
           "unnamed_heads", "unregister"]
