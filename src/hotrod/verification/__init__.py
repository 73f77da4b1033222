"""Verification on the task's own measure: one small comparer per measure (`examples.measure_of`).

- `generation`: language models (logits, token agreement, exact match, task exact match);
- `embeddings`: feature-extraction encoders (hidden-state and embedding cosine);
- `classification`: label agreement, or rank agreement for one-output heads (cross-encoders);
- `tokens`: entity F1 of token-classification heads;
- `answers`: exact match and SQuAD F1 of question-answering heads.

`examples` reads the task files and builds the built-in examples, `rows` turns examples into the rows
a head sees (shared with int8-static calibration), `metrics` holds the pure task metrics.
`compare.compare` runs the model's measure; `measures` holds one per task.
"""
