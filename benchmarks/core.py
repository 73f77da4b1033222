"""W1 and W2 side by side: hotrod fp32 on ONNX Runtime against transformers' PyTorch `generate`.

Both systems get the same seeded random checkpoint, the same prompt and the same thread count; runs
are interleaved after a warm-up and the medians compared as ratios in one run. The tokens of both
systems are checked to be identical before any time is reported.

    python benchmarks/core.py [--workloads W1,W2] [--runs 5] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch
import transformers

import hotrod
from hotrod.artifact import is_artifact
from hotrod.bench.timing import interleaved, median
from hotrod.bench.workloads import WORKLOADS, checkpoint
from hotrod.runtime.base import cpu_threads

HF_CLASSES = {"W1": transformers.AutoModelForCausalLM, "W2": transformers.AutoModelForSeq2SeqLM}


def run_workload(workload_id: str, runs: int, threads: int, cache: Path) -> dict:
    workload = WORKLOADS[workload_id]
    source = checkpoint(workload, cache / "checkpoints")
    artifact = cache / "artifacts" / f"{workload_id}-fp32"
    if not is_artifact(artifact):
        hotrod.optimize(source, artifact, force=True)
    ours = hotrod.load(artifact, threads=threads)
    theirs = HF_CLASSES[workload_id].from_pretrained(source).eval()
    ids, mask = workload.inputs(ours.dims.vocab_size)
    kwargs = workload.generate_kwargs()
    pad = {"pad_token_id": theirs.config.eos_token_id}

    def run_theirs():
        with torch.inference_mode():
            return theirs.generate(ids, attention_mask=mask, **kwargs, **pad)

    def run_ours():
        return ours.generate(ids, attention_mask=mask, **kwargs)

    identical = torch.equal(run_ours(), run_theirs())
    times = interleaved({"pytorch": run_theirs, "hotrod": run_ours}, runs=runs)
    return {
        "workload": workload_id,
        "description": workload.description,
        "tokens_identical": identical,
        "seconds": times,
        "median_s": {name: median(t) for name, t in times.items()},
        "speedup": median(times["pytorch"]) / median(times["hotrod"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="threads for both systems (default: all cores)")
    parser.add_argument("--json", type=Path, default=None, help="write every raw run here")
    args = parser.parse_args()
    threads = cpu_threads(args.threads)
    torch.set_num_threads(threads)
    cache = Path(os.environ.get("HOTROD_CACHE", Path.home() / ".cache" / "hotrod")) / "bench"
    results = [run_workload(w.strip(), args.runs, threads, cache) for w in args.workloads.split(",")]

    print(f"\n{platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, medians of {args.runs} interleaved runs")
    print(f"{'workload':<10}{'PyTorch s':>11}{'hotrod s':>10}{'speedup':>9}  tokens identical")
    for r in results:
        m = r["median_s"]
        print(f"{r['workload']:<10}{m['pytorch']:>11.3f}{m['hotrod']:>10.3f}{r['speedup']:>8.2f}x  "
              f"{'yes' if r['tokens_identical'] else 'NO'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": threads, "machine": platform.uname()._asdict(),
                                         "results": results}, indent=2))
    return 0 if all(r["tokens_identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
