"""hotrod's CPU kernels, each timed with and without it on this machine (`hotrod tune`), on the workloads'
artifacts: W1 (GPT-2) and W2 (t5-small shape) at int4-b256 and int8 on their prompt and greedy steps, W3 (batch 1)
at int8, int8-static and bf16-products (where this CPU runs its kernels), W6 (batch 1) at int8, W7 at int8 on its
100 documents' shape (one row of 95 tokens a document here). Run under benchmarks/without_amx.sh, the kernels'
paths for a CPU without AMX against onnxruntime's own paths there.

    python benchmarks/tune_kernels.py --out benchmarks/results/NAME [--runs N] [--threads N]

Writes NAME/tune.json and NAME/tune.md: per artifact, each kernel's median with it and without it, its gain (the
median over rounds of each round's ratio), the rounds it lost and the sign test's p, and whether `hotrod tune` would leave it
out here. The record `hotrod tune` keeps is written into a temporary cache, not this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

CASES = [  # (workload, precision, batch, length, new tokens)
    ("W1", "int4-b256", 1, 32, 64), ("W1", "int8", 1, 32, 64), ("W2", "int4-b256", 1, 32, 64), ("W2", "int8", 1, 32, 64),
    ("W3", "int8", 1, 128, 0), ("W3", "int8-static", 1, 128, 0), ("W3", "bf16-products", 1, 128, 0),
    ("W6", "int8", 1, 384, 0), ("W7", "int8", 100, 95, 0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for tune.json and tune.md")
    parser.add_argument("--runs", type=int, default=15, help="interleaved rounds per artifact")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    args = parser.parse_args()
    from hotrod import precisions
    from hotrod.bench import workloads
    from hotrod.bench.harness import cached_artifact
    from hotrod.bench.tune import tune_artifact

    results, lines = [], ["| artifact | kernel | with it ms | without ms | gain | rounds lost | p | here |", "|" + "---|" * 8]
    for workload, precision, batch, length, new_tokens in CASES:
        if not precisions.get(precision).has_kernels("cpu"):
            continue
        artifact = cached_artifact(workloads.checkpoint(workloads.WORKLOADS[workload]), precision)
        with tempfile.TemporaryDirectory() as cache:  # the record goes here, not into this machine's cache
            before, os.environ["HOTROD_CACHE"] = os.environ.get("HOTROD_CACHE"), cache
            try:
                tuning = tune_artifact(artifact, batch=batch, length=length, new_tokens=max(new_tokens, 1),
                                       runs=args.runs, threads=args.threads)
            finally:
                if before is None:
                    del os.environ["HOTROD_CACHE"]
                else:
                    os.environ["HOTROD_CACHE"] = before
        name = f"{workload} {precision}"
        for t in tuning.timings:
            results.append({"artifact": name, **asdict(t), "p": t.chance, "left_out": t.left_out})
            lines.append(f"| {name} | {t.kernel} | {t.with_ms:.2f} | {t.without_ms:.2f} | {t.speedup:.2f}x | "
                         f"{t.lost} of {t.rounds} | {t.chance:.3f} | {'onnxruntime' if t.left_out else 'kernel'} |")
        print("\n".join(lines[-len(tuning.timings):]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tune.json").write_text(json.dumps({"runs": args.runs, "threads": args.threads, "kernels": results},
                                                   indent=2))
    (args.out / "tune.md").write_text("# hotrod tune on the workloads' artifacts\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
