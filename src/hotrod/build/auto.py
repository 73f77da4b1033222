"""`--precision auto`: build every candidate precision, verify and time each, keep the fastest that passes.

For onnxruntime the fp32 export is built once and each candidate is that export lowered to one precision
in its own directory; for the torch engine a candidate is the engine's weights in one precision
(`hotrod.build.static_engine`). Each is verified against the source (`hotrod.verification.compare`) and timed on this machine,
interleaved with the others so drift hits all alike. A candidate passes when its score drops by at most `max_drop` below the
source's own (task exact match when a language model's examples carry targets, else agreement with the
source on the task's measure: generations, embeddings, labels, rankings, entities or answers). The
fastest passing candidate wins; if none passes, fp32 is kept and the closest candidate is named.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from hotrod import tasks
from hotrod.errors import HotrodError, first_line
from hotrod.precisions import REFERENCE, REGISTRY
from hotrod.timing import interleaved, median
from hotrod.verification.compare import Example, Remembered, compare, measure
from hotrod.verification.inputs import token_rows

TIMING_RUNS = 3
TIMED_EXAMPLES = 4
TIMED_NEW_TOKENS = 16


@dataclass
class Candidate:
    precision: str
    seconds: float | None = None
    speedup: float | None = None  # over the fp32 candidate
    score: float | None = None
    drop: float | None = None
    status: str = "rejected"  # kept (the winner), passed, rejected or failed
    reason: str = ""
    figures: dict | None = None

    def row(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "figures"}


def candidates(device: str, backend: str = "onnxruntime") -> list[str]:
    """The registry's candidates (`hotrod.precisions`) whose kernels `device` has here: for onnxruntime
    fp32, half precision where it runs it, then the int8 and int4 variants; for the torch engine each of
    its precisions torch runs there (fp8 on GPUs with fp8 tensor cores only)."""
    if backend == "torch":
        return [name for name, p in REGISTRY.items() if p.engine and p.engine_refusal(device) is None]
    return [name for name, p in REGISTRY.items() if p.candidate and p.has_kernels(device)]


def choose(build: Callable[[str, Path], Any], load: Callable[[Any], Any], reference: Any,
           examples: Sequence[Example], precisions: Sequence[str], max_drop: float, workdir: Path,
           progress: bool = False) -> tuple[Candidate, list[Candidate]]:
    """Build (`build(precision, dir)`), load (`load` of what `build` returned), verify and time each
    precision; returns the winner and the table."""
    table, models = [], {}
    reference = Remembered(reference)  # every candidate is compared with the same source outputs
    for precision in precisions:
        candidate = Candidate(precision)
        table.append(candidate)
        try:
            models[precision] = load(build(precision, workdir / precision))
            candidate.figures = compare(models[precision], reference, examples)
        except (HotrodError, RuntimeError, ValueError) as exc:  # one failing candidate never sinks the others
            candidate.status, candidate.reason = "failed", first_line(exc)
            shutil.rmtree(workdir / precision, ignore_errors=True)
            models.pop(precision, None)
    _time(models, table, examples)
    _judge(table, max_drop)
    return _pick(table, max_drop), table


def _time(models: dict[str, Any], table: list[Candidate], examples: Sequence[Example]) -> None:
    if not models:
        raise HotrodError("no candidate precision could be built")
    workload = _workload(next(iter(models.values())), examples)
    times = interleaved({p: (lambda m=m: workload(m)) for p, m in models.items()}, runs=TIMING_RUNS, settle=0.05)
    base = median(times[REFERENCE]) if REFERENCE in times else None
    for candidate in table:
        if candidate.precision in times:
            candidate.seconds = median(times[candidate.precision])
            candidate.speedup = base / candidate.seconds if base else None


def _workload(model: Any, examples: Sequence[Example]) -> Callable[[Any], Any]:
    """What a candidate is timed on: greedy generation of a few prompts, embedding all examples, or a head's
    forward over the rows of all examples as its task builds them."""
    texts = [e.text for e in examples]
    if not model.spec.generates and not tasks.get(model.task).bare:  # a head: the rows its task runs
        rows = measure(model).rows(model, examples)
        return lambda m: m.run_rows(rows)
    if not model.spec.generates:
        rows = [row for row in token_rows(model, texts) if row]
        return lambda m: m.embed(rows)
    rows = token_rows(model, texts[:TIMED_EXAMPLES], room=TIMED_NEW_TOKENS)
    prompts = [torch.tensor([row], dtype=torch.long) for row in rows if row]

    def generate(m):
        for ids in prompts:
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=TIMED_NEW_TOKENS,
                       min_new_tokens=TIMED_NEW_TOKENS, do_sample=False, num_beams=1)

    return generate


def _judge(table: list[Candidate], max_drop: float) -> None:
    for candidate in table:
        if candidate.figures is None:
            continue
        figures = candidate.figures
        candidate.score = figures["score"]
        candidate.drop = figures.get("source_task_exact_match", 1.0) - figures["score"]
        if candidate.drop <= max_drop + 1e-9:
            candidate.status, candidate.reason = "passed", "within the budget"
        else:
            candidate.reason = f"drop {candidate.drop:.4f} > {max_drop}"


def _pick(table: list[Candidate], max_drop: float) -> Candidate:
    passing = [c for c in table if c.status == "passed" and c.seconds is not None]
    if passing:
        winner = min(passing, key=lambda c: c.seconds)
        winner.status, winner.reason = "kept", "fastest within the budget"
        return winner
    measured = [c for c in table if c.drop is not None]
    closest = min(measured, key=lambda c: c.drop) if measured else None
    fallback = next((c for c in table if c.precision == REFERENCE and c.figures is not None), None)
    if fallback is None:
        raise HotrodError(f"no candidate precision could be built and verified, not even {REFERENCE}")
    note = f"; closest was {closest.precision} (drop {closest.drop:.4f})" if closest else ""
    warnings.warn(f"no candidate met --max-drop {max_drop}{note}; keeping {REFERENCE}", stacklevel=2)
    fallback.status, fallback.reason = "kept", f"no candidate met the budget{note}"
    return fallback


def format_table(rows: Sequence[dict]) -> str:
    """The candidates as a plain-text table, for the CLI and the demo report."""
    lines = [f"{'precision':<12}{'time s':>9}{'speedup':>9}{'score':>8}{'drop':>8}  {'status':<9}reason"]
    for row in rows:
        lines.append(
            f"{row['precision']:<12}{_num(row['seconds'], '.3f'):>9}{_num(row['speedup'], '.2f', 'x'):>9}"
            f"{_num(row['score'], '.3f'):>8}{_num(row['drop'], '.3f'):>8}  {row['status']:<9}{row['reason']}"
        )
    return "\n".join(lines)


def _num(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"
