"""`hotrod demo` for the trained heads (intent classifier, people-and-places tagger, question answerer,
cross-encoder) on all-MiniLM-L6-v2.

Each head is built with `hotrod.optimize`'s defaults at every precision of PRECISIONS and reports what the
manifest's verification section says; then hotrod's answers are set against transformers' (the reference) on
the held-out examples, whose names and places the head never saw in training: the task's accuracy on both
sides, how alike hotrod's answers are to the reference's (identical answers; for a ranker, passage pairs
ordered alike), the task's score with the reference's answers as the targets, a few answers side by side,
and the time of each on the same requests, interleaved in one run (medians).
"""

from __future__ import annotations

import json
import string
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

from hotrod.artifact import MANIFEST, is_artifact
from hotrod.build.graphs import code_fingerprint
from hotrod.demo.models import DemoModel
from hotrod.demo.report import DemoResult
from hotrod.pipelines.base import Row, padded
from hotrod.source import weights_sha256
from hotrod.tasks.constants import ANSWER, CLASSIFY, RERANK, TOKENS
from hotrod.timing import interleaved, median

# int8-static and int8-full calibrated on optimize's built-in texts; bf16-products where this CPU has its kernels
# (`built_here`)
PRECISIONS = ("fp32", "int8", "int8-static", "int8-full", "bf16-products")
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
    built = {p: _built(source, root / f"{demo.name}-{p}", p, progress) for p in built_here()}
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
                      "same_answers_as_pipeline": answer.same(ours[precision], theirs), "same_means": answer.same_means,
                      "score_against_pipeline": answer.score(ours[precision], theirs)},
        ))
    return results


def built_here() -> tuple[str, ...]:
    """PRECISIONS whose kernels this machine has (`hotrod.precisions.Precision.has_kernels`)."""
    from hotrod import precisions

    return tuple(name for name in PRECISIONS if precisions.get(name).has_kernels("cpu"))


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
    if TASKS[task].reference is not None:
        return TASKS[task].reference(source)
    from transformers import pipeline

    return pipeline(task, model=str(source), device="cpu", **TASKS[task].options)


def pair_classifier(source: Path):
    """The reranking reference: transformers' text-classification pipeline, which scores (text, text_pair)."""
    from transformers import pipeline

    return pipeline(CLASSIFY, model=str(source), device="cpu")


class TransformersAnswers:
    """The question-answering reference: transformers' head class in fp32 on PyTorch, its spans picked as
    transformers 4.x's question-answering pipeline picked them (`hotrod.pipelines.answer` keeps that algorithm;
    transformers 5 no longer ships the pipeline). It reads rows as `HotrodModel.run_rows` does, each batch
    padded to its longest row."""

    def __init__(self, source: Path):
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        self.model = AutoModelForQuestionAnswering.from_pretrained(source).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        config = self.model.config
        self.dims = SimpleNamespace(max_positions=config.max_position_embeddings,
                                    type_vocab_size=config.type_vocab_size)

    def run_rows(self, rows: Sequence[Row], batch_size: int) -> list[dict]:
        import torch

        outputs = []
        for first in range(0, len(rows), batch_size):
            chunk = rows[first:first + batch_size]
            ids, mask, types = padded(chunk, self.tokenizer.pad_token_id)
            with torch.inference_mode():
                out = self.model(input_ids=ids, attention_mask=mask, token_type_ids=types)
            outputs += [{"start_logits": out.start_logits[i, :len(r)], "end_logits": out.end_logits[i, :len(r)]}
                        for i, r in enumerate(chunk)]
        return outputs


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


def answer_spans(model, texts: Sequence[str]) -> list[str]:
    """The answer of each "question<TAB>context" text, through hotrod's question-answering pipeline steps on
    `model` (a HotrodModel, or the transformers reference)."""
    from hotrod.pipelines import answer

    pairs = [tuple(text.split("\t", 1)) for text in texts]
    prepared = answer.prepare(model, pairs)
    return [a["answer"] for a in answer.finish(model, prepared, model.run_rows(prepared.rows, BATCH))]


def rerank_pipeline(pipe, texts: Sequence[str]) -> list[str]:
    """Each "query<TAB>passage<TAB>..." text's passages best first, as "3,0,7,...": the pipeline's score of each
    (query, passage) pair through a sigmoid, as sentence-transformers' CrossEncoder gives it, equal scores
    in the passages' order (as `HotrodModel.rerank`)."""
    orders = []
    for text in texts:
        query, *passages = text.split("\t")
        scores = [a["score"] for a in pipe([{"text": query, "text_pair": p} for p in passages], batch_size=BATCH,
                                           function_to_apply="sigmoid")]
        orders.append(",".join(str(i) for i in sorted(range(len(scores)), key=lambda i: -scores[i])))
    return orders


def rerank_hotrod(model, texts: Sequence[str]) -> list[str]:
    """Each "query<TAB>passage<TAB>..." text's passages best first, as `model.rerank` orders them."""
    orders = []
    for text in texts:
        query, *passages = text.split("\t")
        orders.append(",".join(str(a["index"]) for a in model.rerank(query, passages)))
    return orders


def reciprocal_rank(predicted: Sequence[str], targets: Sequence[str]) -> float:
    """The mean of 1 / the place of each target's first passage in the predicted order (a target is the
    answer's index, or another ranker's order, whose best is the one looked for)."""
    return sum(1 / (order.split(",").index(target.split(",")[0]) + 1)
               for order, target in zip(predicted, targets)) / len(targets)


def orders_agreement(ours: Sequence[str], theirs: Sequence[str]) -> float:
    """The share of each query's passage pairs that two rankers order alike (`verification.metrics`' rank
    agreement, on the places the orders give): near-ties among passages that do not answer can swap without
    changing what a reader sees first."""
    from hotrod.verification.metrics import order_agreement

    def places(order: str) -> list[float]:
        ranked = [int(i) for i in order.split(",")]
        return [-float(ranked.index(i)) for i in range(len(ranked))]

    return order_agreement((places(a), places(b)) for a, b in zip(ours, theirs))


def _answer_words(text: str) -> list[str]:
    """SQuAD's normalization: lowercase, no punctuation or articles, single spaces."""
    kept = "".join(c for c in text.lower() if c not in string.punctuation)
    return [w for w in kept.split() if w not in ("a", "an", "the")]


def answer_f1(predicted: Sequence[str], targets: Sequence[str]) -> float:
    """SQuAD's answer F1: the mean over examples of the word overlap's F1 (1 where both are empty)."""
    total = 0.0
    for ours, theirs in zip(predicted, targets):
        a, b = _answer_words(ours), _answer_words(theirs)
        common = sum(min(a.count(w), b.count(w)) for w in set(b))
        total += float(a == b) if not a or not b else 2 * common / (len(a) + len(b))
    return total / len(targets)


def answer_exact_match(predicted: Sequence[str], targets: Sequence[str]) -> float:
    """SQuAD's exact match: the share of answers equal to their target once normalized."""
    return sum(_answer_words(p) == _answer_words(t) for p, t in zip(predicted, targets)) / len(targets)


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
    def __init__(self, measure: str, pipeline: Callable, hotrod: Callable, score: Callable,
                 reference: Callable | None = None, same: Callable | None = None,
                 same_means: str = "answers identical", **options):
        self.measure, self.pipeline, self.hotrod, self.score = measure, pipeline, hotrod, score
        self.reference = reference  # makes the reference from the checkpoint, where it is not a pipeline
        self.same = same or accuracy  # how alike hotrod's answers are to the reference's, 0..1
        self.same_means = same_means
        self.options = options  # the reference pipeline's


TASKS = {
    CLASSIFY: _Answer("held-out intent accuracy", classify_pipeline, classify_hotrod, accuracy),
    TOKENS: _Answer("held-out entity F1", tag_pipeline, tag_hotrod, entity_f1, aggregation_strategy="simple"),
    ANSWER: _Answer("held-out answer F1", answer_spans, answer_spans, answer_f1, reference=TransformersAnswers),
    RERANK: _Answer("held-out mean reciprocal rank", rerank_pipeline, rerank_hotrod, reciprocal_rank,
                    reference=pair_classifier, same=orders_agreement, same_means="passage pairs ordered alike"),
}


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
