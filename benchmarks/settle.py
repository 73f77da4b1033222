"""What the bench's idle pause before each run costs each system: one generating workload's hotrod builds
and llama.cpp's Q4_0 and Q8_0, timed interleaved as `hotrod bench` times them (each run after
`hotrod.timing.SETTLE_S` of idle) and back to back (no pause), in alternating blocks.

    python benchmarks/settle.py [--workload W2] [--runs 7] [--blocks 4] [--threads 2]

On a virtual machine whose host slows an idle core's clock, a run that starts after a pause pays for the clock
coming back up, a larger share of a short run than of a long one; this script says how much, per system,
on this machine. Prints one line per block: each system's median over its runs.
"""

from __future__ import annotations

import argparse
import statistics

from hotrod.bench import harness, llamacpp
from hotrod.bench.runners import pytorch_model
from hotrod.timing import SETTLE_S, interleaved

PRECISIONS = ("int4-b256", "int8")
FORMATS = ("Q4_0", "Q8_0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W2", help="a generating workload (W1, W2)")
    parser.add_argument("--runs", type=int, default=7, help="interleaved runs per block")
    parser.add_argument("--blocks", type=int, default=4, help="blocks, alternately with the pause and without")
    parser.add_argument("--threads", type=int, default=2, help="each system's CPU threads")
    args = parser.parse_args()
    for name in ("runs", "blocks", "threads"):
        if not 1 <= getattr(args, name) <= 1000:
            parser.error(f"--{name} must be within 1..1000, got {getattr(args, name)}")
    if args.workload not in ("W1", "W2"):
        parser.error(f"--workload times a generating workload llama.cpp runs (W1, W2), got {args.workload!r}")
    case = harness.workload_cases([args.workload])[0]
    reference = pytorch_model(case.source, case.kind, task=case.task)
    ids, mask = case.inputs(reference.config.vocab_size, getattr(reference.config, "pad_token_id", None))
    plan = harness._Plan(PRECISIONS, [], 1, args.threads, "cpu", None, False)  # the bench's own builds and loading
    systems = {}
    try:  # each system built inside, so that a failed build still closes the workers built before it
        for precision in PRECISIONS:
            systems[f"hotrod {precision}"] = harness._hotrod(case, ids, mask, precision, plan)
        for name, build in llamacpp.builders(case, ids, mask, args.threads).items():
            if name.endswith(FORMATS):
                systems[name] = build()
        calls = {name: system.call for name, system in systems.items()}
        for block in range(args.blocks):
            settle = SETTLE_S if block % 2 == 0 else 0.0
            times = interleaved(calls, runs=args.runs, warmup=1, settle=settle)
            print(f"settle {settle}: " + "  ".join(f"{name} {statistics.median(t) * 1e3:.0f} ms"
                                                  for name, t in times.items()), flush=True)
    finally:
        for system in systems.values():
            if system.close is not None:
                system.close()


if __name__ == "__main__":
    main()
