"""benchmarks/product_precision.py's emulated products (the full run reads the demo heads, a benchmark's job):
bf16 rounds inputs and weights and sums in fp32; int8 rounds each input row to 127 steps of its largest value
and each weight row to 64; int8-weights rounds each weight row to 127 steps and leaves the inputs alone; a head
that is not trained is refused in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import product_precision  # noqa: E402


def _linear(weight: list[list[float]]) -> torch.nn.Linear:
    module = torch.nn.Linear(len(weight[0]), len(weight), bias=False)
    module.weight.data = torch.tensor(weight)
    return module


def test_bf16_rounds_inputs_and_weights_only():
    module = _linear([[1.0 + 2 ** -9, 0.0]])  # the weight's last bit is below bf16's
    x = torch.tensor([[1.0 + 2 ** -10, 3.0]])
    assert product_precision.bf16_linear(module, x).item() == 1.0  # both rounded to 1.0, then multiplied
    exact = _linear([[0.5, 0.25]])
    assert product_precision.bf16_linear(exact, torch.tensor([[2.0, 4.0]])).item() == 2.0


def test_int8_keeps_127_steps_of_a_row_and_64_of_a_weight_row():
    module = _linear([[64.0, 1.0]])  # 1.0 is one step of 64 / 64
    x = torch.tensor([[127.0, 0.4]])  # 0.4 rounds to 0 steps of 127 / 127
    assert product_precision.int8_linear(module, x).item() == 127.0 * 64.0


def test_int8_weights_rounds_each_weight_row_to_127_steps_and_no_input():
    module = _linear([[127.0, 0.4], [2.0, 1.0]])  # 0.4 rounds to 0 steps of 127 / 127; 1.0 is 63.5 steps of 2 / 127
    x = torch.tensor([[1.0, 0.001]])  # an input int8_linear would round to 127 and 0 steps
    y = product_precision.int8_weights_linear(module, x)
    assert y[0, 0].item() == 127.0
    assert y[0, 1].item() == pytest.approx(2.0 + 0.001 * 64 * 2.0 / 127)


def test_a_head_that_is_not_trained_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        product_precision.main(["--model", "all-minilm-l6-v2"])
    assert "is not a trained head" in capsys.readouterr().err


def test_an_unknown_model_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        product_precision.main(["--model", "nope"])
    assert "unknown demo model 'nope'" in capsys.readouterr().err
