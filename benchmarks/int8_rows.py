"""What int8's per-row activation scales cost: the same seeded models built at int8-call (onnxruntime's own
dynamic quantization, one scale per call, batch-dependent) and at int8 (per-row scales, `hotrod.optimize.
row_scales`), timed interleaved in one run.

    python benchmarks/int8_rows.py [--out DIR] [--json FILE] [--threads N] [--clock wall|cpu]

Cases: bert-base (W3's shape) forward at batch 1 and 8 x 128 tokens; GPT-2 124M, 32-token prompt and 64
greedy tokens at batch 1 and 8. Prints each case's median seconds and the per-row / per-call ratio.
`--clock cpu` times the process's CPU seconds instead of the wall clock: on a machine other work shares,
at one thread, that counts this process's own work and not its waits for a core.
"""

from __future__ import annotations

import argparse
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


def build(directory: Path, name: str, model: transformers.PreTrainedModel,
          threads: int = 0) -> dict[str, hotrod.HotrodModel]:
    """`model` saved, then optimized at int8-call (the quantizer's per-call scales) and int8 (per-row ones)."""
    checkpoint = directory / name
    if not checkpoint.exists():
        model.eval().save_pretrained(checkpoint)
    built = {}
    for variant, precision in zip(VARIANTS, ("int8-call", "int8")):
        out = directory / f"{name}-{variant}"
        if not out.exists():
            hotrod.optimize(checkpoint, out, precision=precision, progress=False, verify_examples=4)
        built[variant] = hotrod.load(out, threads=threads)
    return built


def timed(models: dict[str, hotrod.HotrodModel], work: Callable, runs: int,
          clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds of `work(model)` per variant, the variants interleaved run by run (first run dropped)."""
    seconds: dict[str, list[float]] = {v: [] for v in models}
    for _ in range(runs + 1):
        for variant, model in models.items():
            start = clock()
            work(model)
            seconds[variant].append(clock() - start)
    return {v: statistics.median(s[1:]) for v, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where to keep the models (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    parser.add_argument("--threads", type=int, default=0, help="threads for onnxruntime and torch (0: all cores)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the process's CPU seconds (for a shared machine, with --threads 1)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.manual_seed(0)
    directory = args.out or Path(tempfile.mkdtemp(prefix="int8-rows-"))
    results = []
    bert = build(directory, "bert-base", transformers.BertModel(transformers.BertConfig()), args.threads)
    for batch in (1, 8):
        ids = torch.randint(1000, 20000, (batch, 128))
        figures = timed(bert, lambda m, ids=ids: m(input_ids=ids, attention_mask=torch.ones_like(ids)),
                        15 if batch == 1 else 7, clock)
        results.append({"case": f"bert-base forward, batch {batch} x 128", "clock": args.clock,
                        "threads": args.threads, **figures})
    gpt2 = build(directory, "gpt2", transformers.GPT2LMHeadModel(transformers.GPT2Config()), args.threads)
    for batch in (1, 8):
        ids = torch.randint(100, 20000, (batch, 32))
        figures = timed(gpt2, lambda m, ids=ids: m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                                                            min_new_tokens=64, do_sample=False), 6, clock)
        results.append({"case": f"GPT-2 124M, batch {batch}, 32 + 64 greedy", "clock": args.clock,
                        "threads": args.threads, **figures})
    for r in results:
        print(f"{r['case']:<40} per-call {r['per-call']:.4f} s  per-row {r['per-row']:.4f} s  "
              f"ratio {r['per-row'] / r['per-call']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
