"""`hotrod demo`: each built-in model optimized for this machine, verified, and timed against PyTorch.

For every demo model (`hotrod.demo_models`: a trained T5 and GPT-2 shipped in the package, and the real
all-MiniLM-L6-v2) the demo runs `optimize --precision auto` (calibrated on held-out inputs that are not
verified on), verifies the kept artifact against the source on the held-out examples, times it side by
side with transformers' PyTorch model, and writes a report (Markdown and a PNG chart) whose path it prints.
Artifacts are kept under the cache and reused while the source and hotrod are unchanged. The heads trained
on all-MiniLM-L6-v2 (an intent classifier, a tagger) are run by `hotrod.demo_heads` instead: built at fp32
and int8, and set against transformers' pipeline.
"""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hotrod.artifact import MANIFEST, is_artifact
from hotrod.auto import format_table
from hotrod.bench.report import pyplot, save_chart
from hotrod.bench.runners import hotrod_runner, pytorch_model, pytorch_runner
from hotrod.build import code_fingerprint
from hotrod.demo_heads import run_head
from hotrod.demo_models import DEMO_MODELS, DemoModel, demo_model
from hotrod.errors import HotrodError
from hotrod.kinds import spec as kind_spec
from hotrod.load import cache_dir, weights_sha256
from hotrod.timing import interleaved, median
from hotrod.verify import Example
from hotrod.version import __version__

VERIFY_EXAMPLES = 100
TIMED_PROMPTS = 8  # generation is timed at batch 1, prompt after prompt
ENCODER_BATCH = 16


@dataclass
class DemoResult:
    name: str
    description: str
    kind: str
    artifact: str
    precision: str
    verification: dict
    candidates: list[dict]
    pytorch_s: float
    hotrod_s: float
    timed: str
    accuracy: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.pytorch_s / self.hotrod_s


def run_demo(names: Sequence[str] | None = None, runs: int = 3, out: str | Path | None = None,
             max_drop: float = 0.01, progress: bool = True) -> Path:
    """Run the demo on `names` (default: every demo model); returns the report's path."""
    if runs < 1:
        raise HotrodError("--runs must be >= 1")
    models = [demo_model(n) for n in names] if names else list(DEMO_MODELS.values())
    root = Path(out) if out else cache_dir() / "demo"
    results = []
    for model in models:
        print(f"\n== {model.name}: {model.description}", file=sys.stderr)
        if model.task is not None:  # a trained head: fp32 and int8 against transformers' pipeline
            results += run_head(model, root, runs, progress)
        else:
            results.append(_run_one(model, root, runs, max_drop, progress))
    print("\n" + summary_table(results))
    report = write_report(results, root / "report", runs, max_drop)
    print(f"\nreport: {report}")
    return report


def _run_one(demo: DemoModel, root: Path, runs: int, max_drop: float, progress: bool) -> DemoResult:
    import hotrod

    source = demo.path()
    verify_set = [Example(text, target or None) for text, target in demo.examples()[:VERIFY_EXAMPLES]]
    artifact = demo_artifact(demo, root, max_drop, progress)
    manifest = json.loads((artifact / MANIFEST).read_text())
    print(format_table(manifest["auto"]["candidates"]), file=sys.stderr)
    ours, theirs = hotrod.load(artifact), pytorch_model(source, demo.kind)
    systems, timed = _systems(ours, theirs, demo, verify_set)
    times = interleaved(systems, runs=runs)
    figures = manifest["verification"]
    return DemoResult(
        name=demo.name, description=demo.description, kind=demo.kind, artifact=str(artifact),
        precision=manifest["options"]["precision"], verification=figures, candidates=manifest["auto"]["candidates"],
        pytorch_s=median(times["pytorch"]), hotrod_s=median(times["hotrod"]), timed=timed,
        accuracy=_accuracy(figures),
    )


def demo_artifact(demo: DemoModel, root: Path, max_drop: float, progress: bool = True) -> Path:
    """The demo model optimized with `--precision auto`, built once and reused while nothing changed."""
    import hotrod

    source = demo.path()
    pairs = demo.examples()
    verify_set = [Example(text, target or None) for text, target in pairs[:VERIFY_EXAMPLES]]
    calibration = [text for text, _ in pairs[VERIFY_EXAMPLES:]] or None  # the built-in texts otherwise
    artifact = root / f"{demo.name}-auto"
    if not _reusable(artifact, source, max_drop):
        hotrod.optimize(source, artifact, precision="auto", calibration=calibration, verify_texts=verify_set,
                        verify_examples=len(verify_set), max_drop=max_drop, force=True, progress=progress)
    return artifact


def _reusable(artifact: Path, source: Path, max_drop: float) -> bool:
    """An earlier demo artifact is kept while hotrod's code, the source weights and the budget are unchanged."""
    if not is_artifact(artifact):
        return False
    manifest = json.loads((artifact / MANIFEST).read_text())
    return (manifest.get("code") == code_fingerprint() and (manifest.get("auto") or {}).get("max_drop") == max_drop
            and manifest["source"]["weights_sha256"] == weights_sha256(source))


def _systems(ours, theirs, demo: DemoModel, examples: list[Example]) -> tuple[dict, str]:
    """PyTorch and hotrod callables over the same inputs, and a phrase saying what is timed."""
    tokenizer = ours.tokenizer
    if not kind_spec(demo.kind).generates:
        texts = [e.text for e in examples]
        batches = [tokenizer(texts[i:i + ENCODER_BATCH], return_tensors="pt", padding=True)
                   for i in range(0, len(texts), ENCODER_BATCH)]
        pairs = [(b["input_ids"], b["attention_mask"]) for b in batches]
        what = f"{len(texts)} sentences, batches of {ENCODER_BATCH}"
        kwargs = None
    else:
        prompts = [tokenizer(e.text, return_tensors="pt") for e in examples[:TIMED_PROMPTS]]
        pairs = [(p["input_ids"], p["attention_mask"]) for p in prompts]
        what = f"{len(pairs)} prompts at batch 1, greedy"
        kwargs = {"do_sample": False, "num_beams": 1}
    ours_calls = [hotrod_runner(ours, ids, mask, kwargs) for ids, mask in pairs]
    theirs_calls = [pytorch_runner(theirs, demo.kind, ids, mask, kwargs) for ids, mask in pairs]
    return {"pytorch": lambda: [c() for c in theirs_calls], "hotrod": lambda: [c() for c in ours_calls]}, what


def _accuracy(figures: dict) -> dict:
    """The demo's accuracy columns: task exact match of both sides, or embedding cosine to the source."""
    if "task_exact_match" in figures:
        return {"measure": "held-out exact match", "pytorch": figures["source_task_exact_match"],
                "hotrod": figures["task_exact_match"]}
    if "embedding_cosine" in figures:
        return {"measure": "embedding cosine to PyTorch", "pytorch": 1.0, "hotrod": figures["embedding_cosine"]}
    return {"measure": figures["score_name"], "pytorch": 1.0, "hotrod": figures["score"]}


def summary_table(results: Sequence[DemoResult]) -> str:
    lines = [f"{'model':<18}{'precision':<13}{'accuracy (PyTorch -> hotrod)':<38}{'PyTorch s':>10}{'hotrod s':>10}"
             f"{'speedup':>9}"]
    for r in results:
        acc = f"{r.accuracy['measure']} {r.accuracy['pytorch']:.3f} -> {r.accuracy['hotrod']:.3f}"
        lines.append(f"{r.name:<18}{r.precision:<13}{acc:<38}{r.pytorch_s:>10.3f}{r.hotrod_s:>10.3f}"
                     f"{r.speedup:>8.2f}x")
    return "\n".join(lines)


def write_report(results: Sequence[DemoResult], directory: Path, runs: int, max_drop: float) -> Path:
    """report.md, report.json and (with matplotlib) speedup.png in `directory`; returns report.md."""
    directory.mkdir(parents=True, exist_ok=True)
    chart = _chart(results, directory / "speedup.png")
    lines = [
        "# hotrod demo",
        "",
        f"Machine: {platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} threads; "
        f"hotrod {__version__}, torch {torch.__version__}. Medians of {runs} interleaved runs after a warm-up. "
        f"Each model was optimized with `--precision auto --max-drop {max_drop}` and verified against its source; "
        "the trained heads (minilm-*) were built at fp32 and int8 with optimize's defaults and are timed against "
        "transformers' pipeline.",
        "",
        "| model | precision | accuracy measure | PyTorch | hotrod | PyTorch s | hotrod s | speedup | timed on |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.precision} | {r.accuracy['measure']} | {r.accuracy['pytorch']:.3f} | "
                     f"{r.accuracy['hotrod']:.3f} | {r.pytorch_s:.3f} | {r.hotrod_s:.3f} | {r.speedup:.2f}x | "
                     f"{r.timed} |")
    if chart:
        lines += ["", f"![speedup over PyTorch]({chart.name})"]
    for r in results:
        if r.candidates:
            lines += ["", f"## {r.name}", "", r.description, "", "Candidates (`--precision auto`):", "", "```",
                      format_table(r.candidates), "```"]
        else:  # a trained head, built at one precision with optimize's defaults
            same = r.accuracy.get("same_answers_as_pipeline")
            lines += ["", f"## {r.name} {r.precision}", "", r.description, "",
                      f"Verification (manifest): {json.dumps(r.verification)}"]
            if same is not None:
                lines += ["", f"Answers identical to transformers' pipeline on {same:.1%} of the held-out examples."]
    report = directory / "report.md"
    report.write_text("\n".join(lines) + "\n")
    (directory / "report.json").write_text(json.dumps([{**r.__dict__, "speedup": r.speedup} for r in results],
                                                      indent=2) + "\n")
    return report


def _chart(results: Sequence[DemoResult], path: Path) -> Path | None:
    plt = pyplot()
    if plt is None:
        return None
    # Horizontal bars, one row per result: long model names stay legible, however many there are.
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(results)))
    rows = range(len(results))
    bars = ax.barh(list(rows), [r.speedup for r in results], color="#d9480f")
    ax.set_yticks(list(rows), [f"{r.name} ({r.precision})" for r in results], fontsize=8)
    ax.invert_yaxis()  # the report's order, top to bottom
    ax.axvline(1.0, color="grey", linewidth=1, linestyle="--")
    for bar, r in zip(bars, results):
        ax.annotate(f" {r.speedup:.1f}x", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    ha="left", va="center", fontsize=8)
    ax.set_title("hotrod --precision auto vs PyTorch eager")
    ax.set_xlim(0, max(r.speedup for r in results) * 1.2)
    return save_chart(plt, fig, ax, "speedup over PyTorch", path, legend=False)
