"""The hardware floor: the least time this machine allows for a workload.

Two kinds of number describe the machine: how fast it reads a working set again and again, and its matrix-multiply
rates, measured with torch (for int8: onnxruntime, hotrod's product and the VNNI units alone, the fastest) on the
threads the benchmark uses (or on the GPU, for `--device cuda`: a large device-to-device copy and large matrix
products), and cached per machine (CPU model, cores, threads, device) so every run compares against the same
floor. A workload's floor is then the larger of its weight traffic over the read rate (batch-1 decoding reads every
weight once per token) and its matrix work over the rate (encoders and prefill are compute bound).

The read rate is measured at working sets from a few MB to 512 MB, since weights that fit in a CPU's last-level
cache (hundreds of MB on some server parts) are read again from it, not from memory, at several times memory's
rate: a floor from memory's bandwidth alone would be beaten there. A working set is read at the rate measured for
the largest measured size that is not larger than it (the faster side), memory's for anything past 512 MB.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from hotrod import precisions
from hotrod.kinds import spec as kind_spec
from hotrod.source import cache_dir

EMBEDDING_NAMES = ("embed", "wte", "wpe", "shared", "relative_attention_bias")
UNIT_STEP_OPS = 24 * 64 * 2  # int8 operations in one step of hotrod_vnni_unit_ops


@dataclass(frozen=True)
class Machine:
    cpu: str
    threads: int
    bandwidth_gbs: float  # streaming read, GB/s
    matmul_gflops: float  # fp32 GEMM, GFLOP/s
    int8_gops: float | None  # int8 GEMM (int32 accumulate), GOP/s: the kernel an int8 graph runs here
    measured: str
    device: str = "cpu"
    gpu: str | None = None  # the GPU's name, for device "cuda"
    # half-precision GEMM, GFLOP/s: fp16 on GPUs; on a CPU with AMX-BF16 or AVX-512 BF16, hotrod's bf16 product
    # (the kernel bf16-products runs); None on other CPUs, which have no fast half path
    half_gflops: float | None = None
    tiles: bool = False  # whether hotrod's kernels used AMX's tiles (the rates above are those of their paths)
    # GB/s reading a working set of each size (MB, as text: the record is JSON) again and again; bandwidth_gbs
    # is the largest's. Empty: not measured (a GPU's), every read at bandwidth_gbs.
    reads_gbs: dict[str, float] = field(default_factory=dict)

    def read_gbs(self, nbytes: float) -> float:
        """GB/s for reading `nbytes` of weights once more after the last time: the rate measured for the largest
        working set not larger than them (the smallest, for less), so that a floor is never above what the
        machine allows: a smaller set is read faster still, and where a larger one measured faster (noise) its
        rate is taken. Past every size measured, or none measured: memory's bandwidth."""
        sizes = sorted((float(size) * 2**20, rate) for size, rate in self.reads_gbs.items())
        if not sizes or nbytes > sizes[-1][0]:
            return self.bandwidth_gbs
        fitting = [i for i, (size, _) in enumerate(sizes) if size <= nbytes]
        return max(rate for _, rate in sizes[fitting[-1] if fitting else 0:])

    def rate(self, precision: str) -> float:
        """Operations per second for matrix work at `precision` (quantized formats compute in int8)."""
        compute = precisions.get(precision).compute
        if compute == "int8" and self.int8_gops:
            return self.int8_gops * 1e9
        if compute == "half" and self.half_gflops:
            return self.half_gflops * 1e9
        return self.matmul_gflops * 1e9


# 2: the CPU's int8 rate is onnxruntime's MatMulInteger; 3: or hotrod's AMX product, the faster; 4: the CPU's
# half rate, hotrod's bf16 product where it runs; 5: whether the kernels used AMX's tiles, recorded; 6: the CPU's
# read rate by working-set size; 7: the CPU's int8 rate, or the VNNI units' own where faster
METHOD = 7
READ_MB = (4, 8, 16, 32, 64, 128, 256, 512)  # working sets whose read rate a CPU's record keeps


def machine(threads: int, refresh: bool = False, root: Path | None = None, device: str = "cpu") -> Machine:
    """This machine's figures, measured once per (CPU, cores, threads, device, AMX's tiles used by hotrod's kernels
    or not) and then read from the cache."""
    from hotrod.runtime.native import cpu_name, tiles_state

    cpu = cpu_name()
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    # METHOD: bumped when a figure is measured another way, so figures cached the old way are measured again.
    identity = f"{METHOD}|{cpu}|{os.cpu_count()}|{threads}" + (f"|{device}|{gpu}" if gpu else "")
    state = tiles_state()  # the int8 and bf16 rates are those of other paths without the tiles
    identity += "" if state == "tiles" else f"|{state}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    path = (root or cache_dir() / "machine") / f"{key}.json"
    if path.is_file() and not refresh:
        return Machine(**json.loads(path.read_text()))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        found = _measure(cpu, threads, device, gpu)
    finally:
        torch.set_num_threads(previous)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(found), indent=2) + "\n")
    return found


def _measure(cpu: str, threads: int, device: str, gpu: str | None) -> Machine:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if device == "cuda":  # sizes that keep a large GPU busy for milliseconds, not microseconds
        return Machine(cpu=cpu, threads=threads, bandwidth_gbs=_bandwidth(2048, "cuda"),
                       matmul_gflops=_tf32_rate(8192), int8_gops=_int8_rate(8192, "cuda"), measured=now,
                       device="cuda", gpu=gpu, half_gflops=_matmul_rate(8192, "cuda", torch.float16))
    from hotrod.runtime.native import tiles_granted

    reads = {str(size): _bandwidth(size) for size in READ_MB}
    return Machine(cpu=cpu, threads=threads, bandwidth_gbs=reads[str(READ_MB[-1])], matmul_gflops=_matmul_rate(),
                   int8_gops=_int8_rate(), measured=now, half_gflops=_cpu_half_rate(2048, threads),
                   tiles=tiles_granted(), reads_gbs=reads)


def _best(fn, repeats: int, device: str = "cpu") -> float:
    """The fastest of `repeats` timed calls after one untimed; GPU work is waited for inside the timing."""
    def once():
        fn()
        if device == "cuda":
            torch.cuda.synchronize()

    once()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return min(times)


def _bandwidth(megabytes: int = 512, device: str = "cpu") -> float:
    data = torch.ones(megabytes * 2**20 // 4, device=device)
    if device == "cuda":  # a device copy reads and writes every byte: the traffic a weight read sees, twice
        target = torch.empty_like(data)
        return 2 * data.numel() * 4 / _best(lambda: target.copy_(data), 5, device) / 1e9
    return data.numel() * 4 / _best(data.sum, 5) / 1e9


def _matmul_rate(size: int = 2048, device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return 2 * size**3 / _best(lambda: a @ b, 5, device) / 1e9


def _tf32_rate(size: int) -> float:
    """The GPU's fp32 rate with TF32 allowed: onnxruntime's CUDA provider runs fp32 products that way by
    default, so a floor from strict fp32 would be beaten; the least time is the tensor cores' time."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return _matmul_rate(size, "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _int8_rate(size: int = 2048, device: str = "cpu") -> float | None:
    """The int8 GEMM rate (int32 accumulate). On the CPU the fastest of onnxruntime's MatMulInteger (uint8 x
    int8), hotrod's own product and the AVX-512 VNNI units alone: torch's CPU int8 product is a reference loop,
    far slower, which would put the floor under what any real build reaches."""
    if device == "cpu":
        threads = torch.get_num_threads()
        return max(_onnxruntime_int8_rate(size, threads), _vnni_unit_rate(threads) or 0.0)
    a = torch.randint(-128, 127, (size, size), dtype=torch.int8, device=device)
    b = torch.randint(-128, 127, (size, size), dtype=torch.int8, device=device)
    try:
        return 2 * size**3 / _best(lambda: torch._int_mm(a, b), 5, device) / 1e9
    except (RuntimeError, AttributeError):  # no int8 GEMM in this torch build for this device
        return None


def _vnni_unit_rate(threads: int, seconds: float = 0.2, repeats: int = 3) -> float | None:
    """GOP/s of the AVX-512 VNNI units alone (`hotrod_vnni_unit_ops`, native/unit_rate.c): VPDPBUSD with
    nothing to wait on, on `threads` threads at once, all their work over the time from the first start to the
    last end (so a thread that ran alone for a while adds nothing); the best of `repeats`. A product
    kernel's rate at one size is what that kernel reaches there, not what the hardware allows: on a Zen 5 hotrod's
    products beat their own 2048^3 figure inside a model, and the floor read 0.8x. None where the library or the
    instruction is missing."""
    from hotrod.runtime import native

    run = native.entry("hotrod_vnni_unit_ops", ctypes.c_double, [ctypes.c_int64])
    probe = run(1 << 18) if run is not None else -1.0  # -1 where this CPU lacks the instruction (the C side checks)
    if probe <= 0:
        return None
    steps = max(1 << 18, int(seconds * probe / UNIT_STEP_OPS))
    barrier = threading.Barrier(threads)

    def one(_: int) -> tuple[float, float]:
        barrier.wait()
        start = time.perf_counter()
        run(steps)  # ctypes lets the GIL go for the call
        return start, time.perf_counter()

    def together(pool: ThreadPoolExecutor) -> float:
        spans = list(pool.map(one, range(threads)))
        return threads * steps * UNIT_STEP_OPS / (max(end for _, end in spans) - min(start for start, _ in spans))

    with ThreadPoolExecutor(threads) as pool:
        return max(together(pool) for _ in range(repeats)) / 1e9


def _onnxruntime_int8_rate(size: int, threads: int) -> float:
    """The faster of onnxruntime's MatMulInteger and, where it runs (AMX's tiles or AVX-512 VNNI), hotrod's own
    int8 product (`hotrod.runtime.i8`): the kernel an int8 graph runs on this CPU."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from hotrod.runtime import i8, native

    rng = np.random.default_rng(0)
    weights = rng.integers(-64, 64, (size, size), dtype=np.int8)
    feed = {"a": rng.integers(0, 256, (size, size), dtype=np.uint8)}
    rates = [_graph_seconds([helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
                            [numpy_helper.from_array(weights, "b")], feed, TensorProto.INT32, threads)]
    if i8.available():
        names = ["b", "offsets", "scales", "bias"]
        packed = [numpy_helper.from_array(a, n) for a, n in zip(i8.pack(weights, np.ones(size, np.float32), None),
                                                                 names)]
        node = helper.make_node(i8.OP, ["a", "s", *names], ["y"], domain=native.DOMAIN, N=size,
                                tiles=int(i8.on_tiles()))
        rates.append(_graph_seconds([node], packed, {**feed, "s": np.ones((size, 1), np.float32)},
                                    TensorProto.FLOAT, threads, native.DOMAIN))
    return 2 * size**3 / min(rates) / 1e9


def _cpu_half_rate(size: int, threads: int) -> float | None:
    """hotrod's bf16 product (`hotrod.runtime.bf16`) where this CPU runs it: the kernel a bf16-products graph's
    products run on; None elsewhere."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from hotrod.runtime import bf16, native

    if not bf16.available():
        return None
    rng = np.random.default_rng(0)
    packed = bf16.pack(rng.standard_normal((size, size)).astype(np.float32), None)
    constants = [numpy_helper.from_array(array, name) for array, name in zip(packed, ("w", "bias"))]
    node = helper.make_node(bf16.OP, ["a", "w", "bias"], ["y"], domain=native.DOMAIN, N=size,
                            tiles=int(bf16.on_tiles()))
    feed = {"a": rng.standard_normal((size, size)).astype(np.float32)}
    return 2 * size**3 / _graph_seconds([node], constants, feed, TensorProto.FLOAT, threads, native.DOMAIN) / 1e9


def _graph_seconds(nodes: list, constants: list, feed: dict, out_type: int, threads: int,
                   domain: str | None = None) -> float:
    """The best time of one run of a graph of `nodes` over `feed` (hotrod's ops in `domain`, where given)."""
    import onnxruntime as ort
    from onnx import helper

    from hotrod.runtime import native

    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
              for name, value in feed.items()]
    output = helper.make_tensor_value_info("y", out_type, None)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph(nodes, "rate", inputs, [output], constants), opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if domain:
        native.use_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return _best(lambda: session.run(None, feed), 5)


def matmul_params(model: torch.nn.Module, kind: str) -> tuple[int, int]:
    """(weights read per decoding step, weights of the whole model) counted over matrix-multiply weights.

    Embedding tables are gathered, not multiplied, so they are left out; an LM head tied to the
    embedding is counted once. For encoder-decoders a step reads only the decoder and the head.
    """
    spec = kind_spec(kind)
    seen, step, total = set(), 0, 0
    for name, param in model.named_parameters():
        if param.dim() != 2 or id(param) in seen or any(e in name for e in EMBEDDING_NAMES):
            continue
        seen.add(id(param))
        total += param.numel()
        if not (spec.generates and spec.encodes) or "decoder" in name or "lm_head" in name:
            step += param.numel()
    if spec.generates and not any("lm_head" in n for n, _ in model.named_parameters()):
        head = model.get_input_embeddings().weight.numel()  # tied head: the embedding, read as a matrix
        step, total = step + head, total + head
    return step, total


def generation_floor(step_params: int, total_params: int, prompt_tokens: int, new_tokens: int,
                     precision: str, m: Machine, rows: int = 1, encoder_only: bool = False) -> float:
    """Seconds: the prompt's matrix work, then each new token's weight traffic (or, if larger, the work of
    its `rows`: the batch's rows times their beams). `encoder_only`: the prompt goes through the weights a
    step does not read (an encoder-decoder's encoder), not through the whole model."""
    prompt_params = total_params - step_params if encoder_only else total_params
    prefill = 2 * prompt_params * prompt_tokens / m.rate(precision)
    weights = step_params * precisions.get(precision).weight_bytes
    per_token = max(weights / (m.read_gbs(weights) * 1e9), 2 * step_params * rows / m.rate(precision))
    return prefill + new_tokens * per_token


def forward_floor(total_params: int, real_tokens: int, precision: str, m: Machine) -> float:
    """Seconds for an encoder forward over the real (unpadded) tokens: work over rate, or weights over bandwidth."""
    weights = total_params * precisions.get(precision).weight_bytes
    return max(2 * total_params * real_tokens / m.rate(precision), weights / (m.read_gbs(weights) * 1e9))
