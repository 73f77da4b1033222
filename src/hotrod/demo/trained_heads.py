"""`hotrod demo` for the trained heads (intent classifier, people-and-places tagger) on all-MiniLM-L6-v2.

Each head is built twice with `hotrod.optimize`'s defaults (fp32 and int8) and reports what the manifest's
verification section says; then hotrod's answers are set against transformers' pipeline (the reference) on
the held-out examples, whose names and places the head never saw in training: the task's accuracy on both
sides, how often hotrod answers exactly as the pipeline, a few answers side by side, and the time of each on
the same requests, interleaved in one run (medians).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hotrod.artifact import MANIFEST, is_artifact
from hotrod.build.graphs import code_fingerprint
from hotrod.demo.models import DemoModel
from hotrod.demo.report import DemoResult
from hotrod.pipelines.base import Row
from hotrod.source import weights_sha256
from hotrod.tasks.constants import CLASSIFY, TOKENS
from hotrod.timing import interleaved, median

PRECISIONS = ("fp32", "int8")
TIMED_REQUESTS = 64  # held-out sentences per timed run
BATCH = 32  # hotrod's run_rows batch, and the pipeline's
SHOWN = 3  # answers printed side by side


def run_head(demo: DemoModel, root: Path, runs: int, progress: bool = True) -> list:
    """One DemoResult per precision (`hotrod.demo.report.DemoResult`): accuracy and time against the pipeline."""

    source = demo.path()
    pairs = demo.examples()
    texts, targets = [t for t, _ in pairs], [t for _, t in pairs]
    answer = TASKS[demo.task]
    pipe = reference_pipeline(source, demo.task)
    theirs = answer.pipeline(pipe, texts)
    built = {p: _built(source, root / f"{demo.name}-{p}", p, progress) for p in PRECISIONS}
    models = {p: _load(path) for p, path in built.items()}
    ours = {p: answer.hotrod(m, texts) for p, m in models.items()}
    _show(texts[:SHOWN], theirs, ours)
    timed = texts[:TIMED_REQUESTS]
    systems: dict[str, Callable[[], object]] = {"pipeline": lambda: answer.pipeline(pipe, timed)}
    systems.update({p: (lambda m=m: answer.hotrod(m, timed)) for p, m in models.items()})
    times = interleaved(systems, runs=runs)
    results = []
    for precision, path in built.items():
        manifest = json.loads((path / MANIFEST).read_text())
        print(f"{precision}: verification {_brief(manifest['verification'])}", file=sys.stderr)
        results.append(DemoResult(
            name=demo.name, description=demo.description, kind=demo.kind, artifact=str(path), precision=precision,
            verification=manifest["verification"], candidates=[], pytorch_s=median(times["pipeline"]),
            hotrod_s=median(times[precision]), timed=f"{len(timed)} held-out sentences, batches of {BATCH}, "
            "against transformers' pipeline",
            accuracy={"measure": answer.measure, "pytorch": answer.score(theirs, targets),
                      "hotrod": answer.score(ours[precision], targets),
                      "same_answers_as_pipeline": _same(ours[precision], theirs)},
        ))
    return results


def _built(source: Path, artifact: Path, precision: str, progress: bool) -> Path:
    """`hotrod.optimize` with its defaults at `precision`, rebuilt only when the code or weights changed."""
    import hotrod

    if is_artifact(artifact):
        manifest = json.loads((artifact / MANIFEST).read_text())
        if (manifest.get("code") == code_fingerprint() and manifest["options"]["precision"] == precision
                and manifest["source"]["weights_sha256"] == weights_sha256(source)):
            return artifact
    return hotrod.optimize(source, artifact, precision=precision, force=True, progress=progress)


def _load(path: Path):
    import hotrod

    return hotrod.load(path)


def reference_pipeline(source: Path, task: str):
    """transformers' pipeline for the head: the reference answers, and the time hotrod is set against."""
    from transformers import pipeline

    return pipeline(task, model=str(source), device="cpu", **TASKS[task].options)


# ---------------------------------------------------------------------------------------------------------
# Answers as comparable strings: the label, or the entities "LABEL=text;LABEL=text" (lowercase)


def classify_pipeline(pipe, texts: Sequence[str]) -> list[str]:
    return [a["label"] for a in pipe(list(texts), batch_size=BATCH)]


def classify_hotrod(model, texts: Sequence[str]) -> list[str]:
    from hotrod.pipelines import classify

    prepared = classify.prepare(model, list(texts))
    return [a["label"] for a in classify.finish(model, prepared, model.run_rows(prepared.rows, BATCH))]


def tag_pipeline(pipe, texts: Sequence[str]) -> list[str]:
    answers = pipe(list(texts), batch_size=BATCH)
    return [";".join(f"{e['entity_group']}={e['word']}" for e in answer) for answer in answers]


def tag_hotrod(model, texts: Sequence[str]) -> list[str]:
    """Entities from the tagger's per-token labels, grouped as the pipeline's "simple" aggregation does."""
    encoded = model.tokenizer(list(texts), return_offsets_mapping=True)
    types = encoded.get("token_type_ids")
    rows = [Row(list(ids), list(types[i]) if types else None) for i, ids in enumerate(encoded["input_ids"])]
    outputs = model.run_rows(rows, BATCH)
    answers, tokenizer = [], model.tokenizer
    for ids, offsets, out in zip(encoded["input_ids"], encoded["offset_mapping"], outputs):
        labels = [model.labels[int(i)] for i in out["logits"].argmax(-1)]
        tokens = tokenizer.convert_ids_to_tokens(ids)
        words = [(label, tokenizer.convert_tokens_to_string(tokens[first:last + 1]))
                 for label, first, last in entity_groups(labels, offsets)]
        answers.append(";".join(f"{label}={word}" for label, word in words))
    return answers


def entity_groups(labels: Sequence[str], offsets: Sequence[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """(type, first token, last token) of each entity, grouped as `HotrodModel.tag` groups them
    (`pipelines.tag.groups`); special tokens (empty offsets) are skipped and O groups dropped."""
    from hotrod.pipelines.tag import groups, split_tag

    kept = [i for i, (start, end) in enumerate(offsets) if start != end]
    found = [(split_tag(labels[kept[g[0]]])[1], kept[g[0]], kept[g[-1]]) for g in groups([labels[i] for i in kept])]
    return [group for group in found if group[0] != "O"]


def accuracy(predicted: Sequence[str], targets: Sequence[str]) -> float:
    return sum(p == t for p, t in zip(predicted, targets)) / len(targets)


def entity_f1(predicted: Sequence[str], targets: Sequence[str]) -> float:
    """F1 over (type, text) entities, counted per sentence."""
    right = found = expected = 0
    for ours, theirs in zip(predicted, targets):
        a, b = [e for e in ours.split(";") if e], [e for e in theirs.split(";") if e]
        right += sum(min(a.count(e), b.count(e)) for e in set(b))
        found, expected = found + len(a), expected + len(b)
    precision, recall = right / max(found, 1), right / max(expected, 1)
    return 2 * precision * recall / max(precision + recall, 1e-9)


class _Answer:
    def __init__(self, measure: str, pipeline: Callable, hotrod: Callable, score: Callable, **options):
        self.measure, self.pipeline, self.hotrod, self.score = measure, pipeline, hotrod, score
        self.options = options  # the reference pipeline's


TASKS = {
    CLASSIFY: _Answer("held-out intent accuracy", classify_pipeline, classify_hotrod, accuracy),
    TOKENS: _Answer("held-out entity F1", tag_pipeline, tag_hotrod, entity_f1, aggregation_strategy="simple"),
}


def _same(ours: Sequence[str], theirs: Sequence[str]) -> float:
    return accuracy(ours, theirs)


def _show(texts: Sequence[str], theirs: Sequence[str], ours: dict[str, list[str]]) -> None:
    for i, text in enumerate(texts):
        print(f"  {text!r}\n    pipeline: {theirs[i]}", file=sys.stderr)
        for precision, answers in ours.items():
            print(f"    hotrod {precision}: {answers[i]}", file=sys.stderr)


def _brief(figures: dict | None) -> str:
    if not figures:
        return "none"
    keys = ("examples", "hidden_max_abs", "hidden_cosine", "score_name", "score")
    return ", ".join(f"{k} {figures[k]:.4g}" if isinstance(figures[k], float) else f"{k} {figures[k]}"
                     for k in keys if k in figures)
