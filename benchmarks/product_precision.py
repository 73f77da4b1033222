"""How much a trained head's answers move when only its products are rounded, before any kernel exists for it.

    python benchmarks/product_precision.py [--model minilm-qa] [--out FILE]

The demo's trained question answerer (or another trained head of `hotrod.demo.models`) runs in transformers
on PyTorch with every `nn.Linear` replaced by an emulation of a product precision, everything else in fp32:
- bf16: inputs and weights rounded to bf16 (nearest even), sums in fp32, as AMX-BF16's TDPBF16PS computes;
- int8: each input row scaled to [-127, 127] by its largest |value| and rounded, each weight row (output
  channel) to [-64, 64] (hotrod's 7-bit range), sums exact: a stand-in for the int8 precision's arithmetic;
- int8-weights: the weights alone rounded, each output channel to [-127, 127] (the full 8 bits), the inputs
  kept in fp32: the least any int8 product with a scale per channel can move the answers, whatever its
  activations' arithmetic.
Each is scored against the fp32 model's own answers (the task's score with those as targets, and how many
are identical) and against the held-out targets, so a precision can be judged on the task's metric before
hotrod builds it. Writes JSON to --out (default: stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hotrod.demo import trained_heads as heads
from hotrod.demo.models import demo_model
from hotrod.errors import HotrodError


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def bf16_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(_bf16(x), _bf16(module.weight), module.bias)


def int8_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127
    channels = module.weight.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 64
    return F.linear(torch.round(x / rows) * rows, torch.round(module.weight / channels) * channels, module.bias)


def int8_weights_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    channels = module.weight.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127
    return F.linear(x, torch.round(module.weight / channels) * channels, module.bias)


EMULATED: dict[str, Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]] = {
    "bf16": bf16_linear, "int8": int8_linear, "int8-weights": int8_weights_linear}


def answers(name: str, emulate: Callable | None, texts: list[str]) -> list[str]:
    """The head's answers through its reference, every product emulated by `emulate` (None: fp32)."""
    model = demo_model(name)
    answer = heads.TASKS[model.task]
    reference = heads.reference_pipeline(model.path(), model.task)
    network = getattr(reference, "model", reference)
    if emulate is not None:
        for module in network.modules():
            if isinstance(module, torch.nn.Linear):
                module.forward = lambda x, m=module: emulate(m, x)
    return answer.pipeline(reference, texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-qa", help="a trained head of hotrod.demo.models")
    parser.add_argument("--out", help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    try:
        model = demo_model(args.model)
    except HotrodError as error:
        parser.error(str(error))
    if model.task is None:
        parser.error(f"{args.model} is not a trained head; choose one whose demo entry names a task")
    answer = heads.TASKS[model.task]
    pairs = model.examples()
    texts, targets = [t for t, _ in pairs], [t for _, t in pairs]
    fp32 = answers(args.model, None, texts)
    result = {"model": args.model, "measure": answer.measure, "examples": len(texts),
              "fp32": {"score": answer.score(fp32, targets)}}
    for precision, emulate in EMULATED.items():
        ours = answers(args.model, emulate, texts)
        result[precision] = {"score": answer.score(ours, targets), "score_against_fp32": answer.score(ours, fp32),
                             "same_as_fp32": answer.same(ours, fp32)}
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
