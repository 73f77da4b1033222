"""Prompt lookup decoding on an input-grounded workload with real weights: the generating demo models
(`hotrod.demo.models`: GPT-2 writing a sentence's numbers in digits, which copies the rest of the sentence;
GPT-2 turning number words into digits and T5 rewriting dates, which copy little), greedy at batch 1 over
their held-out examples, with and without drafting.

    python benchmarks/assisted.py [--draft N] [--examples K] [--precision P] [--json FILE]

Each example is decoded plain and with drafts, interleaved, `--runs` times; per model it prints tokens per
second both ways (the median of each example's runs, summed over the examples), whether every token was
the same, and the drafts' acceptance (accepted / drafted tokens, and tokens per verifying pass).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import hotrod
from hotrod.demo.models import DEMO_MODELS, demo_model
from hotrod.generation import config as gen_config
from hotrod.generation.lookup import Lookup
from hotrod.model import torch_threads

MODELS = ("gpt2-itn", "gpt2-numbers", "t5-dates")


def build(name: str, directory: Path, precision: str) -> hotrod.HotrodModel:
    out = directory / f"{name}-{precision}"
    if not out.exists():
        hotrod.optimize(demo_model(name).path(), out, precision=precision, progress=False)
    return hotrod.load(out)


def decode(model: hotrod.HotrodModel, ids: torch.Tensor, draft: int, new_tokens: int) -> list[int]:
    """One greedy decoding of `ids` through `generate()`, plain (draft 0) or with prompt lookup: what is timed."""
    lookup = {"prompt_lookup_num_tokens": draft} if draft else {}
    return model.generate(ids, max_new_tokens=new_tokens, **lookup).flatten().tolist()


def counted(model: hotrod.HotrodModel, ids: torch.Tensor, draft: int, new_tokens: int) -> Lookup:
    """The same decoding with prompt lookup run by hand (not timed), for its drafted and accepted counts,
    which `generate()` does not return: greedy, it drafts what the timed runs drafted."""
    values = gen_config.merge(model.generation_config, None, {"max_new_tokens": new_tokens})
    settings = model.settings(ids.shape[1], values)
    lookup = Lookup(model.decoding_state(settings), settings, draft)
    with torch_threads(model.backend.loop_threads):
        lookup.generate(ids, torch.ones_like(ids))
    return lookup


def measure(name: str, model: hotrod.HotrodModel, examples: list[str], draft: int, runs: int,
            new_tokens: int) -> dict:
    tokenizer = model.tokenizer
    seconds = {"plain": 0.0, "lookup": 0.0}
    generated = drafted = accepted = passes = 0
    same = True
    for text in examples:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        times: dict[str, list[float]] = {"plain": [], "lookup": []}
        for _ in range(runs + 1):  # the first run of each is not timed
            for variant, n in (("plain", 0), ("lookup", draft)):
                start = time.perf_counter()
                tokens = decode(model, ids, n, new_tokens)
                times[variant].append(time.perf_counter() - start)
                if variant == "plain":
                    plain = tokens
                else:
                    same &= tokens == plain
        seconds = {v: seconds[v] + statistics.median(times[v][1:]) for v in seconds}
        new = len(model.spec.generated(torch.tensor(plain), ids.shape[1]))
        lookup = counted(model, ids, draft, new_tokens)
        generated += new
        drafted, accepted = drafted + lookup.drafted, accepted + lookup.accepted
        passes += new - lookup.accepted  # every pass yields one token beyond the accepted draft
    return {"model": name, "examples": len(examples), "generated_tokens": generated,
            "plain_tokens_per_s": generated / seconds["plain"], "lookup_tokens_per_s": generated / seconds["lookup"],
            "speedup": seconds["plain"] / seconds["lookup"], "identical_tokens": same, "drafted": drafted,
            "accepted": accepted, "acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_pass": generated / passes if passes else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--examples", type=int, default=64, help="held-out examples per model")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per example and variant")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated demo models")
    parser.add_argument("--out", type=Path, default=None, help="where to keep the built models")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    unknown = sorted(set(args.models.split(",")) - set(DEMO_MODELS))
    if unknown:
        parser.error(f"unknown demo model {unknown[0]!r}; choose from {', '.join(DEMO_MODELS)}")
    directory = args.out or Path(tempfile.mkdtemp(prefix="assisted-"))
    results = []
    for name in args.models.split(","):
        model = build(name, directory, args.precision)
        examples = [text for text, _ in demo_model(name).examples()[: args.examples]]
        result = measure(name, model, examples, args.draft, args.runs, args.new_tokens)
        results.append(result)
        print(f"{name:14s} plain {result['plain_tokens_per_s']:7.1f} tok/s  lookup {result['lookup_tokens_per_s']:7.1f} "
              f"tok/s  {result['speedup']:.2f}x  identical {result['identical_tokens']}  acceptance "
              f"{result['acceptance']:.2f}  tokens/pass {result['tokens_per_pass']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"precision": args.precision, "draft": args.draft, "results": results},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
