"""What int8's per-row activation scales cost: the same seeded models built with onnxruntime's own dynamic
quantization (one scale per call, batch-dependent) and with hotrod's per-row scales (`hotrod.optimize.
row_scales`), timed interleaved in one run.

    python benchmarks/int8_rows.py [--out DIR] [--json FILE]

Cases: bert-base (W3's shape) forward at batch 1 and 8 x 128 tokens; GPT-2 124M, 32-token prompt and 64
greedy tokens at batch 1 and 8. Prints each case's median seconds and the per-row / per-call ratio.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import hotrod

VARIANTS = ("per-call", "per-row")


def build(directory: Path, name: str, model: transformers.PreTrainedModel) -> dict[str, hotrod.HotrodModel]:
    """`model` saved, then optimized at int8 twice: per-call scales (the quantizer's) and per-row ones."""
    quantize = importlib.import_module("hotrod.optimize.quantize")
    checkpoint = directory / name
    if not checkpoint.exists():
        model.eval().save_pretrained(checkpoint)
    per_row = quantize.per_row_activations
    built = {}
    try:
        for variant, rewrite in zip(VARIANTS, (lambda graph: graph, per_row)):
            out = directory / f"{name}-{variant}"
            if not out.exists():
                quantize.per_row_activations = rewrite
                hotrod.optimize(checkpoint, out, precision="int8", progress=False, verify_examples=4)
            built[variant] = hotrod.load(out)
    finally:
        quantize.per_row_activations = per_row
    return built


def timed(models: dict[str, hotrod.HotrodModel], work: Callable, runs: int) -> dict[str, float]:
    """Median seconds of `work(model)` per variant, the variants interleaved run by run (first run dropped)."""
    seconds: dict[str, list[float]] = {v: [] for v in models}
    for _ in range(runs + 1):
        for variant, model in models.items():
            start = time.perf_counter()
            work(model)
            seconds[variant].append(time.perf_counter() - start)
    return {v: statistics.median(s[1:]) for v, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where to keep the models (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    torch.manual_seed(0)
    directory = args.out or Path(tempfile.mkdtemp(prefix="int8-rows-"))
    results = []
    bert = build(directory, "bert-base", transformers.BertModel(transformers.BertConfig()))
    for batch in (1, 8):
        ids = torch.randint(1000, 20000, (batch, 128))
        figures = timed(bert, lambda m, ids=ids: m(input_ids=ids, attention_mask=torch.ones_like(ids)),
                        15 if batch == 1 else 7)
        results.append({"case": f"bert-base forward, batch {batch} x 128", **figures})
    gpt2 = build(directory, "gpt2", transformers.GPT2LMHeadModel(transformers.GPT2Config()))
    for batch in (1, 8):
        ids = torch.randint(100, 20000, (batch, 32))
        figures = timed(gpt2, lambda m, ids=ids: m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                                                            min_new_tokens=64, do_sample=False), 6)
        results.append({"case": f"GPT-2 124M, batch {batch}, 32 + 64 greedy", **figures})
    for r in results:
        print(f"{r['case']:<40} per-call {r['per-call']:.4f} s  per-row {r['per-row']:.4f} s  "
              f"ratio {r['per-row'] / r['per-call']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
