"""`hotrod demo`: optimize a built-in model, generate with it, and time it against PyTorch.

The built-in model is GPT-2 124M with seeded random weights (workload W1), built locally so the demo
needs no download; it checks that hotrod's tokens equal transformers' before showing any timing.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hotrod.bench.timing import interleaved, median
from hotrod.bench.workloads import WORKLOADS, checkpoint
from hotrod.errors import HotrodError
from hotrod.load import cache_dir


def run_demo(new_tokens: int = 32, runs: int = 3, out: str | None = None) -> int:
    import transformers

    import hotrod
    from hotrod.artifact import is_artifact

    if new_tokens < 1 or runs < 1:
        raise HotrodError("--new-tokens and --runs must be >= 1")
    root = Path(out) if out else cache_dir() / "demo"
    workload = WORKLOADS["W1"]
    print(f"demo model: {workload.description.split(',')[0]} (seeded random weights)")
    source = checkpoint(workload, root / "checkpoints")
    artifact = root / "gpt2-fp32"
    if not is_artifact(artifact):
        hotrod.optimize(source, artifact, force=True)
    print(f"artifact: {artifact}")
    model = hotrod.load(artifact)
    reference = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    ids, mask = workload.inputs(model.dims.vocab_size)
    kwargs = {**workload.generate_kwargs(), "max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
    def run_pytorch():
        with torch.inference_mode():
            return reference.generate(ids, attention_mask=mask, pad_token_id=reference.config.eos_token_id, **kwargs)

    def run_hotrod():
        return model.generate(ids, attention_mask=mask, **kwargs)

    same = torch.equal(run_hotrod(), run_pytorch())
    print(f"tokens identical to transformers: {'yes' if same else 'NO'}")
    times = interleaved({"pytorch": run_pytorch, "hotrod": run_hotrod}, runs=runs)
    base = median(times["pytorch"])
    print(f"\n{'system':<28}{'median s':>10}{'ms/token':>10}{'speedup':>9}")
    for name, label in (("pytorch", "PyTorch eager (transformers)"), ("hotrod", "hotrod fp32 onnxruntime")):
        t = median(times[name])
        print(f"{label:<28}{t:>10.3f}{1000 * t / new_tokens:>10.1f}{base / t:>8.2f}x")
    return 0 if same else 1
