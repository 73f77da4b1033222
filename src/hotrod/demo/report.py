"""`hotrod demo`'s results and its report: report.md, report.json and a chart of each model's speedup."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hotrod.bench.report import pyplot, save_chart
from hotrod.build.auto import format_table
from hotrod.version import __version__


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


def summary_table(results: Sequence[DemoResult]) -> str:
    """The console's table; its text columns as wide as their longest entry, so that none runs into the next."""
    accuracies = [f"{r.accuracy['measure']} {r.accuracy['pytorch']:.3f} -> {r.accuracy['hotrod']:.3f}" for r in results]
    accuracy_head = "accuracy (PyTorch -> hotrod)"
    model = max([len("model"), *(len(r.name) for r in results)]) + 2
    precision = max([len("precision"), *(len(r.precision) for r in results)]) + 2
    accuracy = max([len(accuracy_head), *(len(a) for a in accuracies)]) + 2
    lines = [f"{'model':<{model}}{'precision':<{precision}}{accuracy_head:<{accuracy}}{'PyTorch s':>10}{'hotrod s':>10}"
             f"{'speedup':>9}"]
    for r, acc in zip(results, accuracies):
        lines.append(f"{r.name:<{model}}{r.precision:<{precision}}{acc:<{accuracy}}{r.pytorch_s:>10.3f}"
                     f"{r.hotrod_s:>10.3f}{r.speedup:>8.2f}x")
    return "\n".join(lines)


def write_report(results: Sequence[DemoResult], directory: Path, runs: int, max_drop: float,
                 head_precisions: Sequence[str] = ()) -> Path:
    """report.md, report.json and (with matplotlib) speedup.png in `directory`; returns report.md.
    `head_precisions`: the precisions the trained heads among `results` were built at."""
    directory.mkdir(parents=True, exist_ok=True)
    heads = (f"the trained heads (minilm-*) were built at {', '.join(head_precisions)} with optimize's defaults and "
             "are timed against transformers' pipeline.") if head_precisions else ""
    chart = _chart(results, directory / "speedup.png")
    lines = [
        "# hotrod demo",
        "",
        f"Machine: {platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} threads; "
        f"hotrod {__version__}, torch {torch.__version__}. Medians of {runs} interleaved runs after a warm-up. "
        f"Each model was optimized with `--precision auto --max-drop {max_drop}` and verified against its source"
        + ("; " + heads if heads else "."),
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
                means = r.accuracy.get("same_means", "answers identical")
                lines += ["", f"Beside transformers' answers on the held-out examples: {means}, {same:.1%}."]
            against = r.accuracy.get("score_against_pipeline")
            if against is not None:
                measure = r.accuracy["measure"].removeprefix("held-out ")
                lines += ["", f"Its {measure} with transformers' answers as the targets: {against:.4f}."]
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
    ax.set_xlabel("speedup over PyTorch")
    return save_chart(plt, fig, ax, "", path, legend=False)
