"""hotrod's encoder attention alone on each path this CPU takes without AMX's tiles (bf16 pairs on VDPBF16PS,
values rounded to bf16 and multiplied on FMAs, and int8-full's int8 products on VPDPBUSD) beside onnxruntime's
fp32 attention, in alternating blocks of runs (each after an idle pause, so that one session's spinning threads
are not timed in the next).

    python benchmarks/attention_paths.py [--heads 16] [--head 64] [--length 384] [--batch 1] [--threads 2]
        [--runs 20]

Prints each path's median milliseconds and its largest difference from the float64 answer of the bf16-rounded
operands (the int8 path's own rounding is coarser).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from hotrod.asks import ATTENTION_KEY, ask
from hotrod.runtime import attention, native

BLOCKS, WARMUP, PAUSE_S = 3, 5, 0.5


def graph(heads: int, arithmetic: str = "bf16") -> onnx.ModelProto:
    """q, k, v [B, S, W] and an additive mask -> ONNX's Attention, its build asking for `arithmetic` attention."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, None, None]) for name in "qkv"]
    inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], q_num_heads=heads, kv_num_heads=heads)
    model = helper.make_model(helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 23)])
    return ask(model, ATTENTION_KEY, arithmetic)


def session(model: onnx.ModelProto, threads: int, rewrite: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if rewrite:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        assert attention.rewrite(model) == 1
        native.use_library(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def exact(feeds: dict, heads: int) -> np.ndarray:
    """The answer in float64 from the bf16-rounded operands."""
    def split(x: np.ndarray) -> np.ndarray:
        x = x.astype(ml_dtypes.bfloat16).astype(np.float64)
        return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)

    q, k, v = (split(feeds[name]) for name in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + feeds["m"]
    numerators = np.exp(scores - scores.max(-1, keepdims=True))
    out = (numerators.astype(ml_dtypes.bfloat16).astype(np.float64) @ v) / numerators.sum(-1, keepdims=True)
    return out.transpose(0, 2, 1, 3).reshape(feeds["q"].shape)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head", type=int, default=64)
    parser.add_argument("--length", type=int, default=384)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20, help="timed runs a block")
    args = parser.parse_args(argv)
    if min(args.heads, args.head, args.length, args.batch, args.threads, args.runs) < 1:
        parser.error("--heads, --head, --length, --batch, --threads and --runs take 1 or more")
    if not attention.available():
        raise SystemExit("attention_paths: error: hotrod's attention does not run on this CPU")
    rng = np.random.default_rng(0)
    width = args.heads * args.head
    feeds = {name: rng.standard_normal((args.batch, args.length, width), dtype=np.float32) for name in "qkv"}
    feeds["m"] = np.zeros((1, 1, args.length, args.length), np.float32)
    model = graph(args.heads)
    sessions = {"onnxruntime fp32": session(model, args.threads, rewrite=False)}
    if attention.path() == attention.PAIRS:
        sessions["hotrod, bf16 pairs (VDPBF16PS)"] = session(model, args.threads, rewrite=True)
    with attention.pairs_left_out():
        sessions[f"hotrod, {'tiles' if attention.path() == attention.TILES else 'FMAs'}"] = session(
            model, args.threads, rewrite=True)
    if attention.quads_ready():
        sessions["hotrod, int8 (VPDPBUSD)"] = session(graph(args.heads, "int8"), args.threads, rewrite=True)
    truth = exact(feeds, args.heads)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(BLOCKS):
        for name, run in sessions.items():
            time.sleep(PAUSE_S)
            for _ in range(WARMUP):
                run.run(None, feeds)
            for _ in range(args.runs):
                start = time.perf_counter()
                run.run(None, feeds)
                times[name].append(time.perf_counter() - start)
    print(f"attention, {args.heads} heads of {args.head}, {args.batch} x {args.length}, {args.threads} threads")
    for name, run in sessions.items():
        error = float(np.abs(run.run(None, feeds)[0] - truth).max())
        print(f"  {name:<32} {statistics.median(times[name]) * 1e3:8.3f} ms   max |difference| {error:.2e}")


if __name__ == "__main__":
    main()
