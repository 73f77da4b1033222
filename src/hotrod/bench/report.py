"""The benchmark report: a Markdown table per case and PNG charts, beside results.json."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

from hotrod.bench.harness import Result
from hotrod.files import write_whole
from hotrod.kinds import spec as kind_spec


def write_report(results: Sequence[Result], out: Path) -> Path:
    """report.md (and, with matplotlib, speedup.png and latency charts) in `out`; returns report.md."""
    charts = _charts(results, out)
    gpu = any("gpu_memory_bytes" in f for r in results for f in r.systems.values())
    lines = ["# hotrod bench", "", "Medians (p50) and tails of interleaved runs after a warm-up; `x floor` is the "
             "time over the least this machine allows (`hotrod.bench.floor`); RSS is the process's after loading "
             "the system" + ("; GPU MB is the device memory the system added by loading and its first call"
                             if gpu else "") + ".", ""]
    for result in results:
        lines += _case_table(result)
    lines += [f"![{chart.stem}]({chart.name})" for chart in charts]
    return write_whole(out / "report.md", "\n".join(lines) + "\n")


def _case_table(result: Result) -> list[str]:
    case = result.case
    lm = kind_spec(case["kind"]).generates
    gpu = any("gpu_memory_bytes" in f for f in result.systems.values())
    title = f"## {case['name']}: batch {len(case['lengths'])}, prompt {max(case['lengths'])}"
    title += f", {case['new_tokens']} new tokens" if lm else ", forward"
    title += f", beam {case['num_beams']}" if case.get("num_beams", 1) > 1 else ""
    title += f", on {case['device']}" if case.get("device", "cpu") != "cpu" else ""
    rate = "tokens/s" if lm else "seq/s"
    columns = 10 + lm + gpu
    lines = [title, "", f"| system | p50 s | p90 s | p99 s | speedup | x floor | {rate} |"
             + (" first token s |" if lm else "") + " agreement | size MB | RSS MB |" + (" GPU MB |" if gpu else ""),
             "|---" * columns + "|"]
    for name, f in result.systems.items():
        throughput = f.get("tokens_per_s", f.get("sequences_per_s"))
        first = f" {f['first_token_s']:.4f} |" if lm else ""
        size = f"{f['size_bytes'] / 1e6:.1f}" if f.get("size_bytes") else "-"
        device_memory = f" {f['gpu_memory_bytes'] / 1e6:.0f} |" if gpu else ""
        lines.append(f"| {name} | {f['p50_s']:.4f} | {f['p90_s']:.4f} | {f['p99_s']:.4f} | {f['speedup']:.2f}x | "
                     f"{f['times_floor']:.1f}x | {throughput:.1f} |{first} {f['agreement']:.4f} | {size} | "
                     f"{f['rss_bytes'] / 1e6:.0f} |{device_memory}")
    for peer, why in result.skipped.items():
        lines.append(f"| {peer} | skipped: {why.replace('|', '/')} |" + " |" * (columns - 2))
    return lines + [""]


def pyplot():
    """matplotlib's pyplot drawing to files, or None (with a note) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'hotrod[demo]'): no charts", file=sys.stderr)
        return None
    return plt


def _charts(results: Sequence[Result], out: Path) -> list[Path]:
    plt = pyplot()
    if plt is None:
        return []
    charts = [_speedup_chart(plt, results, out / "speedup.png")]
    for axis, label in (("batch", "batch size"), ("seq", "sequence length")):
        chart = _latency_chart(plt, results, axis, label, out / f"latency_vs_{axis}.png")
        if chart:
            charts.append(chart)
    return charts


def _speedup_chart(plt, results: Sequence[Result], path: Path) -> Path:
    systems = [s for s in results[0].systems if s != "pytorch"]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(results)), 3.2))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs = [j + i * width for j in range(len(results))]
        # a system a case lacks (skipped there) draws no bar, never a 0x one
        ax.bar(xs, [r.systems.get(system, {}).get("speedup", math.nan) for r in results], width, label=system)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(results))],
                  [r.case["name"] for r in results])
    return save_chart(plt, fig, ax, "speedup over PyTorch", path)


def _latency_chart(plt, results: Sequence[Result], axis: str, label: str, path: Path) -> Path | None:
    """p50 latency against batch size (or sequence length), one line per system, other axis fixed."""
    def key(r):
        return len(r.case["lengths"]) if axis == "batch" else max(r.case["lengths"])

    def other(r):
        return max(r.case["lengths"]) if axis == "batch" else len(r.case["lengths"])

    groups: dict[int, list[Result]] = {}
    for r in results:
        groups.setdefault(other(r), []).append(r)
    best = max(groups.values(), key=len)
    if len({key(r) for r in best}) < 2:
        return None
    best.sort(key=key)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for system in (s for s in best[0].systems if all(s in r.systems for r in best)):
        ax.plot([key(r) for r in best], [r.systems[system]["p50_s"] for r in best], marker="o", label=system)
    ax.set_xlabel(label)
    return save_chart(plt, fig, ax, "p50 latency, s", path)


def save_chart(plt, fig, ax, ylabel: str, path: Path, legend: bool = True) -> Path:
    ax.set_ylabel(ylabel)
    if legend:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
