"""What hotrod's CPU kernels gain: one int8 artifact loaded four times, on onnxruntime's own ops, on hotrod's
kernels with nothing fused into its products and fp32 attention (its per-row quantization, and its products
where the CPU has AMX), with the GELU, the residual and the next product's row quantization fused into them,
and on all of hotrod's kernels (its attention in bf16 where the CPU has AMX-BF16, as the int8 build asks),
timed interleaved in one run.

    python benchmarks/cpu_kernels.py [--out DIR] [--json FILE] [--threads N] [--runs N]

Cases: bert-base (W3's shape) forward at batch 1 x 128 tokens (W3), batch 16 of 16..128 tokens (W4) and
batch 1 x 384 tokens (W6's length); a MiniLM-L6 cross-encoder's shape (W7's) at 100 x 95 tokens; GPT-2 124M
(W1's shape) int8, 32-token prompt and 64 greedy tokens. Prints each case's median seconds for each and the
ratios to onnxruntime's ops, with the kernels that ran and the CPU's. The answers of all but the last variant
are checked equal, bit for bit, first; the last's largest absolute difference and least cosine against them
are recorded (its attention rounds to bf16).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import transformers

import hotrod
from hotrod.runtime import attention, i8, native

# each variant: what is switched off as it loads
VARIANTS = {
    "onnxruntime ops": [(native, "library", lambda: None)],
    "hotrod kernels, products unfused, fp32 attention": [(i8, "_is_gelu", lambda node: False),
                                                         (i8, "_residual", lambda *args: None),
                                                         (i8, "quantize_outputs", lambda model: 0),
                                                         (attention, "available", lambda: False)],
    "hotrod kernels, fp32 attention": [(attention, "available", lambda: False)],
    "hotrod kernels": [],
}


def build(directory: Path, name: str, model: transformers.PreTrainedModel, threads: int) -> dict[str, hotrod.HotrodModel]:
    """`model` saved and optimized at int8 once, then loaded as each variant."""
    checkpoint, out = directory / name, directory / f"{name}-int8"
    if not checkpoint.exists():
        model.eval().save_pretrained(checkpoint)
    if not out.exists():
        hotrod.optimize(checkpoint, out, precision="int8", progress=False, verify_examples=0)
    models = {}
    for variant, patches in VARIANTS.items():
        with contextlib.ExitStack() as stack:
            for module, attribute, value in patches:
                stack.enter_context(mock.patch.object(module, attribute, value))
            models[variant] = hotrod.load(out, threads=threads)
    if not models["hotrod kernels"].backend.kernel_ops:
        raise SystemExit("hotrod's kernels did not load here (`make native`; x86-64 with AVX2)")
    return models


def timed(models: dict[str, hotrod.HotrodModel], work: Callable, runs: int) -> dict[str, float]:
    """Median seconds of `work(model)` per variant, the variants interleaved run by run (first run dropped)."""
    seconds: dict[str, list[float]] = {v: [] for v in models}
    for _ in range(runs + 1):
        for variant, model in models.items():
            start = time.perf_counter()
            work(model)
            seconds[variant].append(time.perf_counter() - start)
    return {v: statistics.median(s[1:]) for v, s in seconds.items()}


def same(models: dict[str, hotrod.HotrodModel], work: Callable) -> dict[str, float]:
    """Tokens or hidden states of all variants but the last equal, bit for bit (see `hotrod.runtime.rows` and
    `hotrod.runtime.i8`); the last's distance from them: tokens agreeing, or hidden states' largest absolute
    difference and least cosine over the tokens (not padding)."""
    *exact, last = (work(m) for m in models.values())
    if not isinstance(last, torch.Tensor):
        exact, last = [out.last_hidden_state for out in exact], last.last_hidden_state
    if not all(torch.equal(exact[0], other) for other in exact[1:]):
        raise SystemExit("the kernels' answers differ from onnxruntime's ops'")
    first = exact[0]
    if first.dtype == torch.long:
        return {"token_agreement": (first == last).float().mean().item()}
    tokens = first.norm(dim=-1) > 0  # padding's hidden states are zeros in both
    cosine = torch.nn.functional.cosine_similarity(first[tokens], last[tokens], dim=-1)
    return {"max_abs_difference": (first - last).abs().max().item(), "min_cosine": cosine.min().item()}


def cases(directory: Path, threads: int) -> list[tuple[str, dict, Callable, int]]:
    torch.manual_seed(0)
    bert = build(directory, "bert-base", transformers.BertModel(transformers.BertConfig()), threads)
    minilm = build(directory, "minilm-l6", transformers.BertModel(transformers.BertConfig(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)), threads)
    gpt2 = build(directory, "gpt2", transformers.GPT2LMHeadModel(transformers.GPT2Config()), threads)
    generator = torch.Generator().manual_seed(0)
    one = torch.randint(1000, 20000, (1, 128), generator=generator)
    lengths = torch.randint(16, 129, (16,), generator=generator)
    long = torch.randint(1000, 20000, (1, 384), generator=generator)
    many = torch.randint(1000, 20000, (16, 128), generator=generator)
    mask = (torch.arange(128)[None, :] < lengths[:, None]).long()
    prompt = torch.randint(1000, 20000, (1, 32), generator=generator)
    pairs = torch.randint(1000, 20000, (100, 95), generator=generator)
    return [
        ("W3: bert-base forward, batch 1 x 128", bert,
         lambda m: m(input_ids=one, attention_mask=torch.ones_like(one)), 30),
        ("W4: bert-base forward, batch 16 of 16..128", bert, lambda m: m(input_ids=many, attention_mask=mask), 10),
        ("W6's length: bert-base forward, batch 1 x 384", bert,
         lambda m: m(input_ids=long, attention_mask=torch.ones_like(long)), 15),
        ("W7's shape: MiniLM-L6 forward, 100 x 95", minilm,
         lambda m: m(input_ids=pairs, attention_mask=torch.ones_like(pairs)), 8),
        ("W1 int8: GPT-2 32 + 64 greedy tokens", gpt2,
         lambda m: m.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False), 5),
    ]


def cpu() -> str:
    """This CPU's model name and the instruction sets hotrod's kernels choose by."""
    flags = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8") if f in native.cpu_flags()]
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown"
    return f"{model} ({', '.join(flags)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where to keep the models (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: all cores)")
    parser.add_argument("--runs", type=int, default=0, help="timed runs per case (0: each case's own)")
    args = parser.parse_args()
    if args.threads < 0 or args.runs < 0:
        parser.error("--threads and --runs take 0 or more")
    directory = args.out or Path(tempfile.mkdtemp(prefix="cpu-kernels-"))
    results = []
    for name, models, work, runs in cases(directory, args.threads):
        closeness = same(models, work)
        figures = timed(models, work, args.runs or runs)
        variants = list(VARIANTS)
        ratios = {v: figures[variants[0]] / figures[v] for v in variants[1:]}
        ops = sorted(set().union(*models[variants[-1]].backend.kernel_ops.values()))
        results.append({"case": name, "threads": args.threads, "seconds": figures, "speedups": ratios,
                        "bf16_attention": closeness, "kernels": ops, "cpu": cpu()})
        times = " -> ".join(f"{figures[v] * 1e3:.1f}" for v in VARIANTS)
        print(f"{name}: {times} ms ({' / '.join(f'{r:.3f}x' for r in ratios.values())}; {' + '.join(ops)}; "
              f"{closeness})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
