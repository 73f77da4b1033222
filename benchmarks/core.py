"""W1 and W2 side by side: hotrod on ONNX Runtime against transformers' PyTorch `generate`.

Both systems get the same seeded random checkpoint, the same prompt and the same thread count; runs
are interleaved after a warm-up and the medians compared as ratios in one run. hotrod's fp32 tokens
must equal PyTorch's; for quantized precisions the share of tokens that agree is reported (on random
weights it says little about accuracy: that is judged on trained models).

    python benchmarks/core.py [--workloads W1,W2] [--precisions fp32,int8,int4] [--runs 5] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
import transformers

import hotrod
from hotrod.artifact import is_artifact
from hotrod.bench.timing import interleaved, median
from hotrod.bench.workloads import WORKLOADS, checkpoint
from hotrod.load import cache_dir
from hotrod.runtime.base import cpu_threads

HF_CLASSES = {"W1": transformers.AutoModelForCausalLM, "W2": transformers.AutoModelForSeq2SeqLM}


def run_workload(workload_id: str, precisions: list[str], runs: int, threads: int, cache: Path) -> dict:
    workload = WORKLOADS[workload_id]
    source = checkpoint(workload, cache / "checkpoints")
    ours = {}
    for precision in precisions:
        artifact = cache / "artifacts" / f"{workload_id}-{precision}"
        if not is_artifact(artifact):
            hotrod.optimize(source, artifact, precision=precision, force=True)
        ours[precision] = hotrod.load(artifact, threads=threads)
    theirs = HF_CLASSES[workload_id].from_pretrained(source).eval()
    ids, mask = workload.inputs(theirs.config.vocab_size)
    kwargs = workload.generate_kwargs()
    pad = {"pad_token_id": theirs.config.eos_token_id}

    def run_theirs():
        with torch.inference_mode():
            return theirs.generate(ids, attention_mask=mask, **kwargs, **pad)

    def runner(model):
        return lambda: model.generate(ids, attention_mask=mask, **kwargs)

    reference = run_theirs()[:, ids.shape[1]:] if workload_id == "W1" else run_theirs()
    agreement = {}
    for precision, model in ours.items():
        out = runner(model)()
        out = out[:, ids.shape[1]:] if workload_id == "W1" else out
        agreement[precision] = float((out == reference).float().mean())
    systems = {"pytorch": run_theirs, **{f"hotrod {p}": runner(m) for p, m in ours.items()}}
    times = interleaved(systems, runs=runs)
    base = median(times["pytorch"])
    return {
        "workload": workload_id,
        "description": workload.description,
        "token_agreement": agreement,
        "seconds": times,
        "median_s": {name: median(t) for name, t in times.items()},
        "speedup": {name: base / median(t) for name, t in times.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2")
    parser.add_argument("--precisions", default="fp32")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="threads for both systems (default: all cores)")
    parser.add_argument("--json", type=Path, default=None, help="write every raw run here")
    args = parser.parse_args()
    threads = cpu_threads(args.threads)
    torch.set_num_threads(threads)
    cache = cache_dir() / "bench"
    precisions = [p.strip() for p in args.precisions.split(",")]
    results = [run_workload(w.strip(), precisions, args.runs, threads, cache) for w in args.workloads.split(",")]

    print(f"\n{platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, medians of {args.runs} interleaved runs")
    print(f"{'workload':<10}{'system':<16}{'median s':>10}{'speedup':>9}  tokens agreeing with PyTorch")
    for r in results:
        for name, seconds in r["median_s"].items():
            precision = name.split()[-1]
            agree = f"{100 * r['token_agreement'][precision]:.0f}%" if name != "pytorch" else ""
            print(f"{r['workload']:<10}{name:<16}{seconds:>10.3f}{r['speedup'][name]:>8.2f}x  {agree}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": threads, "machine": platform.uname()._asdict(),
                                         "results": results}, indent=2))
    fp32_identical = all(r["token_agreement"].get("fp32", 1.0) == 1.0 for r in results)
    return 0 if fp32_identical else 1


if __name__ == "__main__":
    sys.exit(main())
