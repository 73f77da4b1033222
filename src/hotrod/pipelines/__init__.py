"""What encoder heads are deployed for, as transformers' pipelines answer it: classify, rerank, tag, answer.

Each task is three steps, so that the server can run the middle one in its dynamic batches with other
requests' rows (the scheduler never sees a task):

- `prepare(model, ...) -> Prepared`: checks and tokenizes the inputs into model rows (`Row`), with what
  the last step needs (offsets, which rows belong to which input);
- the rows' forward: `HotrodModel.run_rows(rows)` (or the server's batches) gives each row's outputs,
  trimmed to its length;
- `finish(model, prepared, outputs) -> result`: the task's answer from those outputs.

`HotrodModel.classify` and the other task methods are the three steps in a row.
"""

from hotrod.pipelines.base import Prepared, Row

__all__ = ["Prepared", "Row"]
