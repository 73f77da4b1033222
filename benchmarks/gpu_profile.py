"""Where a GPU workload's time goes: device kernel time against the wall clock, and the host's Python.

    PYTHONPATH=src python benchmarks/gpu_profile.py [--workloads G1,G3] [--precision bf16] [--out DIR]

For each workload of `benchmarks/gpu_engine.py` it builds the engine as that script does, warms it up,
then records one call (a whole `generate`, or an encoder forward) with torch's profiler: the sum of the
kernels' device time, their count and the costliest ones, beside the call's wall time. The difference
is what the device spent waiting for the host; the host's graph launches and its waits on the device are
counted beside them. cProfile over a few more calls names the host's costliest Python functions. Writes
DIR/profile-<workload>.txt and prints a summary table last.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import gpu_engine  # noqa: E402  (the workloads and the engine builder, shared with the benchmark)

# The host's calls into CUDA that say how a call was driven: its graph launches, and its waits on the device
HOST_CALLS = ("cudaGraphLaunch", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def _call(w: gpu_engine.Workload, precision: str, compile: bool, packed: bool | None):
    """The workload's one timed call on hotrod's engine, built as gpu_engine builds it."""
    dtype = torch.float16
    model = gpu_engine.hf_model(w, False, "cuda", dtype)
    ids, mask = gpu_engine.inputs(w, model.config.vocab_size)
    fast = gpu_engine.engine(model, precision, "cuda", compile=compile, packed=packed)
    del model
    if w.new_tokens:
        kwargs = gpu_engine.generate_kwargs(w, fast.config)
        return lambda: fast.generate(ids, attention_mask=mask, **kwargs), fast
    ids, mask = ids.cuda(), mask.cuda()
    return lambda: fast(ids, attention_mask=mask), fast


def _wall(fn, runs: int = 10) -> float:
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def profile(name: str, precision: str, compile: bool, packed: bool | None, out: Path) -> dict:
    w = gpu_engine.WORKLOADS[name]
    fn, fast = _call(w, precision, compile, packed)
    for _ in range(5):
        fn()
    wall = _wall(fn)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_s = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
    host = {e.key: (e.count, e.cpu_time_total / 1e3) for e in prof.key_averages() if e.key in HOST_CALLS}
    stats = io.StringIO()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler, stream=stats).sort_stats("tottime").print_stats(30)
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=25)
    cpu_table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    text = (f"{name} {w.what}, precision {precision}, compile {compile}, packed {packed}\n"
            f"wall {wall * 1e3:.3f} ms (median of 10), kernels {len(kernels)} summing {kernel_s * 1e3:.3f} ms\n"
            f"recorded calls {vars(fast.backend.recorded.stats)}\n"
            f"host calls (count, ms): {host}\n\n"
            f"## by device time\n{table}\n\n## by host time (torch ops)\n{cpu_table}\n\n"
            f"## host Python, 3 calls (cProfile, by own time)\n{stats.getvalue()}")
    suffix = "" if packed is None else f"-packed-{packed}"
    (out / f"profile-{name}-{precision}{'-compile' if compile else ''}{suffix}.txt").write_text(text)
    del fast
    torch.cuda.empty_cache()
    launches, launch_ms = host.get("cudaGraphLaunch", (0, 0.0))
    waits = sum(host.get(name, (0, 0.0))[0] for name in HOST_CALLS if "Synchronize" in name)
    return {"workload": name, "wall_ms": wall * 1e3, "kernels": len(kernels), "kernel_ms": kernel_s * 1e3,
            "graph_launches": launches, "launch_ms": launch_ms, "waits": waits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="G1,G3,G5")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "int8-weight", "fp8"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--packed", choices=["auto", "yes", "no"], default="auto")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu/profile"))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = sorted(set(names) - set(gpu_engine.WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(gpu_engine.WORKLOADS)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    packed = {"auto": None, "yes": True, "no": False}[args.packed]
    rows = []
    for name in names:
        try:
            rows.append(profile(name, args.precision, args.compile, packed, args.out))
        except Exception as exc:  # noqa: BLE001  (one failing workload is reported, the others still run)
            rows.append({"workload": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(rows[-1], flush=True)
    print("| workload | wall ms | kernels | kernel ms | device busy | graph launches (host ms) | waits on the device |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['workload']} | failed: {r['error']} | | | | | |")
        else:
            print(f"| {r['workload']} | {r['wall_ms']:.3f} | {r['kernels']} | {r['kernel_ms']:.3f} | "
                  f"{r['kernel_ms'] / r['wall_ms']:.0%} | {r['graph_launches']} ({r['launch_ms']:.3f}) | "
                  f"{r['waits']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
