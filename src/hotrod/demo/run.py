"""`hotrod demo`: each built-in model optimized for this machine, verified, and timed against PyTorch.

For every demo model (`hotrod.demo.models`: a trained T5, GPT-2 and Marian shipped in the package, and
the real all-MiniLM-L6-v2) the demo runs `optimize --precision auto` (calibrated on held-out inputs that are
not verified on), verifies the kept artifact against the source on the held-out examples, times it side by
side with transformers' PyTorch model, and writes a report (Markdown and a PNG chart) whose path it prints.
Artifacts are kept under the cache and reused while the source and hotrod are unchanged. The heads trained
on all-MiniLM-L6-v2 (an intent classifier, a tagger, a question answerer, a cross-encoder) are run by
`hotrod.demo.trained_heads` instead: built at each of its precisions, and set against transformers' reference.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hotrod.artifact import MANIFEST, is_artifact
from hotrod.bench.runners import hotrod_runner, pytorch_model, pytorch_runner
from hotrod.build.auto import format_table
from hotrod.build.graphs import code_fingerprint
from hotrod.demo.models import DEMO_MODELS, DemoModel, demo_model
from hotrod.demo.report import DemoResult, summary_table, write_report
from hotrod.demo.trained_heads import built_here, run_head
from hotrod.errors import HotrodError
from hotrod.kinds import spec as kind_spec
from hotrod.source import cache_dir, weights_sha256
from hotrod.timing import interleaved, median
from hotrod.verification.compare import Example

VERIFY_EXAMPLES = 100
TIMED_PROMPTS = 8  # generation is timed at batch 1, prompt after prompt
ENCODER_BATCH = 16


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
        if model.task is not None:  # a trained head: each precision against transformers' reference
            results += run_head(model, root, runs, progress)
        else:
            results.append(_run_one(model, root, runs, max_drop, progress))
    print("\n" + summary_table(results))
    report = write_report(results, root / "report", runs, max_drop, built_here())
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
