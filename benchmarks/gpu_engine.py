"""G1-G5 on one GPU: hotrod's static engine beside transformers eager in half precision and transformers'
own fast path (static cache + torch.compile), against the floor measured on the device.

    PYTHONPATH=src python benchmarks/gpu_engine.py [--out DIR] [--workloads G1,G2] [--peers G1] [--runs N]
        [--precision bf16|fp16|int8-weight|fp8] [--compile] [--smoke]

Every model is built from seeded random weights in memory (nothing is downloaded). Before timing,
each workload checks itself: fp32 engine tokens equal transformers' fp32 tokens (G1, G2), and the
half-precision engine agrees with transformers' half-precision model (the share of equal tokens, or
the cosine of hidden states). Times are medians after warm-up, hotrod and transformers run in turn,
the device synchronized before each clock read. `--smoke` runs tiny shapes on whatever device there
is (the CPU too), to check the script itself. Writes results.json, report.md and summary.json under DIR.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from hotrod.contracts import graph_contracts
from hotrod.model import HotrodModel
from hotrod.models import get_family
from hotrod.runtime.static import EngineOptions, StaticBackend
from hotrod.timing import interleaved, median, synchronized


@dataclass
class Workload:
    name: str
    what: str
    target: str
    hf_class: type
    config: Callable[[bool], transformers.PretrainedConfig]  # smoke -> config
    batch: list[int]  # prompt (or input) lengths
    new_tokens: int = 0  # 0: an encoder forward


def _gpt2(smoke):
    if smoke:
        return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Config()


def _t5_small(smoke):
    if smoke:
        return transformers.T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=1000,
                                     decoder_start_token_id=0)
    return transformers.T5Config(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8, vocab_size=32128,
                                 decoder_start_token_id=0)


def _t5_3b(smoke):
    if smoke:
        return _t5_small(True)
    return transformers.T5Config(d_model=1024, d_ff=16384, d_kv=128, num_layers=24, num_heads=32, vocab_size=32128,
                                 decoder_start_token_id=0)


def _bert(large: bool):
    def config(smoke):
        if smoke:
            return transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=128, vocab_size=1000)
        if large:
            return transformers.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                           intermediate_size=4096)
        return transformers.BertConfig()

    return config


WORKLOADS = {
    "G1": Workload("G1", "GPT-2 124M, batch 1, 32-token prompt + 64 greedy tokens",
                   ">= 15x transformers eager fp16; faster than static cache + compile; step <= 0.3 ms",
                   transformers.GPT2LMHeadModel, _gpt2, [32], 64),
    "G2": Workload("G2", "t5-small shape, 32 input tokens -> 64 greedy tokens", ">= 10x transformers eager",
                   transformers.T5ForConditionalGeneration, _t5_small, [32], 64),
    "G3": Workload("G3", "BERT-large, batch 1 x 128 tokens", "<= 0.5 ms", transformers.BertModel, _bert(True), [128]),
    "G4": Workload("G4", "bert-base, batch 16, lengths 16..128", ">= 5x transformers eager fp16",
                   transformers.BertModel, _bert(False), [16 + (112 * i) // 15 for i in range(16)]),
    "G5": Workload("G5", "T5-3B shape, batch 1, 12-token input, 8 greedy tokens", "<= 20 ms end to end",
                   transformers.T5ForConditionalGeneration, _t5_3b, [12], 8),
}


@dataclass
class Result:
    workload: str
    hotrod_s: float | None = None
    baseline_s: float | None = None
    compiled_peer_s: float | None = None
    ratio: float | None = None
    checks: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def timed(systems: dict[str, Callable[[], object]], device: str, runs: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds of each system, run in turn (interleaved) after a warm-up, the device synchronized
    before each clock read."""
    times = interleaved({name: synchronized(fn, device) for name, fn in systems.items()}, runs, warmup, settle=0.0)
    return {name: median(values) for name, values in times.items()}


def inputs(w: Workload, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    width = max(w.batch)
    ids = torch.zeros(len(w.batch), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(w.batch):
        ids[row, :length] = torch.randint(5, vocab, (length,), generator=generator)
        mask[row, :length] = 1
    return ids, mask


def hf_model(w: Workload, smoke: bool, device: str, dtype: torch.dtype):
    torch.manual_seed(0)
    with torch.device(device):
        model = w.hf_class(w.config(smoke)).eval()
    return model.to(dtype)


def engine(model, precision: str, device: str, compile: bool, packed: bool | None = None) -> HotrodModel:
    """hotrod's static engine over the weights of transformers' `model` (in memory, no checkpoint)."""
    config = model.config
    family = get_family(config.model_type)
    module = family.build(config)
    module.load_hf({k: v.float().cpu() for k, v in model.state_dict().items()})
    contracts = graph_contracts(family.kind, family.dims(config))
    options = EngineOptions(device=device, precision=precision, compile=compile, packed=packed)
    backend = StaticBackend(module, contracts, options)
    generation = getattr(model, "generation_config", None) or transformers.GenerationConfig()
    return HotrodModel(family, config, backend, generation)


def generate_kwargs(w: Workload, config) -> dict:
    eos = config.eos_token_id
    return dict(max_new_tokens=w.new_tokens, min_new_tokens=w.new_tokens, do_sample=False, num_beams=1,
                pad_token_id=config.pad_token_id if config.pad_token_id is not None else eos)


@torch.inference_mode()
def run_lm(w: Workload, args, device: str) -> Result:
    result = Result(w.name)
    half = torch.float16
    reference = hf_model(w, args.smoke, device, torch.float32)
    ids, mask = inputs(w, reference.config.vocab_size)
    kwargs = generate_kwargs(w, reference.config)
    if w.name != "G5":  # fp32 parity: the engine's own arithmetic, unrounded
        ours = engine(reference, "fp32", device, compile=False)
        expected = reference.generate(ids.to(device), attention_mask=mask.to(device), **kwargs).cpu()
        result.checks["fp32_tokens_identical"] = bool(torch.equal(ours.generate(ids, attention_mask=mask, **kwargs), expected))
        del ours
    baseline = reference.to(half)
    fast = engine(baseline, args.precision, device, compile=args.compile)
    hf_tokens = baseline.generate(ids.to(device), attention_mask=mask.to(device), **kwargs).cpu()
    our_tokens = fast.generate(ids, attention_mask=mask, **kwargs)
    result.checks["half_token_agreement"] = float((our_tokens == hf_tokens).float().mean())
    times = timed({"hotrod": lambda: fast.generate(ids, attention_mask=mask, **kwargs),
                   "hotrod_one_token": lambda: fast.generate(ids, attention_mask=mask, max_new_tokens=1),
                   "baseline": lambda: baseline.generate(ids.to(device), attention_mask=mask.to(device), **kwargs)},
                  device, args.runs)
    result.hotrod_s, result.baseline_s = times["hotrod"], times["baseline"]
    result.checks["recorded_calls"] = vars(fast.backend.recorded.stats).copy()
    result.checks["decode_step_s"] = (times["hotrod"] - times["hotrod_one_token"]) / max(w.new_tokens - 1, 1)
    if w.name in args.peers:
        result.compiled_peer_s = _compiled_peer(baseline, ids, mask, kwargs, device, args.runs, result)
    return result


def _compiled_peer(model, ids, mask, kwargs, device, runs, result: Result) -> float | None:
    """transformers' own fast path: a static cache, with which its `generate` compiles the forward itself
    (`generation_config.compile_config`: fullgraph, CUDA graphs via reduce-overhead) on a GPU."""
    try:
        model.generation_config.cache_implementation = "static"
        seconds = timed({"peer": lambda: model.generate(ids.to(device), attention_mask=mask.to(device), **kwargs)},
                        device, runs)["peer"]
        # transformers keeps its compiled forward here once it compiled one (its own criteria decide)
        result.checks["peer_compiled"] = getattr(model, "_compiled_call", None) is not None
        return seconds
    except Exception as exc:  # noqa: BLE001  (a peer that fails is reported, not fatal)
        result.notes.append(f"compiled peer failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return None


@torch.inference_mode()
def run_encoder(w: Workload, args, device: str) -> Result:
    result = Result(w.name)
    baseline = hf_model(w, args.smoke, device, torch.float16)
    ids, mask = inputs(w, baseline.config.vocab_size)
    fast = engine(baseline, args.precision, device, compile=args.compile)
    types = torch.zeros_like(ids)
    on_device = ids.to(device), mask.to(device)  # both sides take and give tensors on the device
    expected = baseline(*on_device).last_hidden_state.float().cpu()
    got = fast(on_device[0], attention_mask=on_device[1]).last_hidden_state.cpu()
    real = mask.bool()
    result.checks["hidden_cosine_vs_hf_half"] = float(torch.nn.functional.cosine_similarity(
        got[real].flatten(), expected[real].flatten(), dim=0))
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    runs = {"hotrod": lambda: fast(on_device[0], attention_mask=on_device[1]),
            "engine_call": lambda: fast.backend.run("encoder", feeds),
            "baseline": lambda: baseline(*on_device)}
    if not real.all():  # what packing (off by default) would give: the same batch on its real tokens only
        packed = engine(baseline, args.precision, device, compile=args.compile, packed=True)
        runs["packed_engine_call"] = lambda: packed.backend.run("encoder", feeds)
    times = timed(runs, device, args.runs)
    result.hotrod_s, result.baseline_s = times["hotrod"], times["baseline"]
    result.checks["engine_call_s"] = times["engine_call"]
    if "packed_engine_call" in times:
        result.checks["packed_engine_call_s"] = times["packed_engine_call"]
    return result


def floor(device: str, smoke: bool) -> dict:
    """The device's two ceilings, measured: copy bandwidth and bf16 matrix rate."""
    if device != "cuda":
        return {}
    n = 1 << (20 if smoke else 28)
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    copy_s = timed({"copy": lambda: dst.copy_(src)}, device, 20)["copy"]
    size = 1024 if smoke else 8192
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    mm_s = timed({"mm": lambda: a @ b}, device, 20)["mm"]
    return {"bandwidth_gb_s": 2 * n * 4 / copy_s / 1e9, "bf16_tflop_s": 2 * size**3 / mm_s / 1e12}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu"))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "int8-weight", "fp8"])
    parser.add_argument("--compile", action="store_true", help="torch.compile each engine graph before recording")
    parser.add_argument("--peers", default="G1,G2",
                        help="workloads that also time transformers' static cache + torch.compile (its compile "
                             "takes minutes on the larger models); empty for none")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device: checks the script")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        parser.error("no CUDA device here; --smoke runs tiny shapes on the CPU")
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    args.peers = _peer_names(args.peers, parser)
    args.out.mkdir(parents=True, exist_ok=True)
    ceilings = floor(device, args.smoke)  # first: a run stopped part way still records what it measured
    print(f"floor: {json.dumps(ceilings)}", flush=True)
    results = []
    for name in names:
        w = WORKLOADS[name]
        print(f"{name}: {w.what}", flush=True)
        run = run_lm if w.new_tokens else run_encoder
        try:
            result = run(w, args, device)
        except Exception as exc:  # noqa: BLE001  (one failing workload is recorded, the others still run)
            traceback.print_exc()
            result = Result(name, notes=[f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"])
        if result.hotrod_s and result.baseline_s:
            result.ratio = result.baseline_s / result.hotrod_s
        results.append(result)
        print(json.dumps(vars(result), default=str), flush=True)
        write(args.out, results, device, ceilings, args)  # after each workload, for the same reason
        if device == "cuda":
            torch.cuda.empty_cache()
    return 0


def _peer_names(value: str, parser: argparse.ArgumentParser) -> set[str]:
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(WORKLOADS))
    if unknown:
        parser.error(f"--peers: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


def write(out: Path, results: list[Result], device: str, ceilings: dict, args) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = {"device": name, "commit": commit, "workloads": {
        r.workload: {"hotrod_s": r.hotrod_s, "baseline_s": r.baseline_s, "ratio": r.ratio,
                     "compiled_peer_s": r.compiled_peer_s} for r in results}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    full = {**summary, "torch": torch.__version__, "transformers": transformers.__version__,
            "precision": args.precision, "compile": args.compile, "smoke": args.smoke, "floor": ceilings,
            "results": [vars(r) for r in results]}
    (out / "results.json").write_text(json.dumps(full, indent=2, default=str) + "\n")
    lines = [f"# GPU workloads on {name}", "", f"commit {commit}, precision {args.precision}, "
             f"compile {args.compile}; floor {json.dumps(ceilings)}", "",
             "| id | work | target | hotrod | transformers eager fp16 | ratio | static cache + compile | checks |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        w = WORKLOADS[r.workload]
        cells = [_ms(r.hotrod_s), _ms(r.baseline_s), f"{r.ratio:.2f}x" if r.ratio else "-", _ms(r.compiled_peer_s)]
        checks = "; ".join(f"{k} {v}" for k, v in r.checks.items()) + "".join(f"; {n}" for n in r.notes)
        lines.append(f"| {r.workload} | {w.what} | {w.target} | " + " | ".join(cells) + f" | {checks} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds else "-"


if __name__ == "__main__":
    sys.exit(main())
