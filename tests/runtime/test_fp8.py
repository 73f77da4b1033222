"""fp8 weights (`hotrod.runtime.fp8`): the arithmetic, checked on a CPU with torch's float8 tensors; the
kernel (torch._scaled_mm) only where the GPU has fp8 tensor cores, and a clear refusal elsewhere."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotrod.build import static_engine
from hotrod.runtime import fp8
from hotrod.runtime.cast import quantize_linears
from hotrod.runtime.fp8 import E4M3, E4M3_MAX, Fp8Linear, dequantize, quantize, reference_linear
from hotrod.runtime.static import EngineOptions, prepare

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU does")


def _cpu_kernel() -> bool:
    """Whether this torch's CPU build takes _scaled_mm with one scale per row (some do, as a slow path)."""
    ones = torch.ones(16, 16).to(E4M3)
    try:
        torch._scaled_mm(ones, ones.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def test_weights_round_to_e4m3_per_output_channel():
    torch.manual_seed(0)
    weight = torch.randn(48, 32) * torch.logspace(-3, 2, 48)[:, None]  # rows of very different sizes
    values, scales = quantize(weight)
    assert values.dtype == E4M3 and scales.dtype == torch.float32 and scales.shape == (48,)
    assert torch.equal(values.float().abs().amax(dim=1), torch.full((48,), E4M3_MAX))  # each row's largest is exact
    error = (dequantize(values, scales) - weight).abs()
    # 3 mantissa bits: half a step is 1/16 of a value; below e4m3's normal range, a fixed step of the scale.
    assert (error <= weight.abs() / 16 + scales[:, None] * 2**-9 + 1e-12).all()


def test_a_zero_row_stays_zero():
    values, scales = quantize(torch.zeros(2, 16))
    assert torch.equal(dequantize(values, scales), torch.zeros(2, 16))


def test_the_reference_matmul_is_close_to_fp32():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    values, scales = quantize(linear.weight.detach())
    x = torch.randn(3, 5, 64)
    got = reference_linear(x, values, scales, linear.bias.detach())
    expected = linear(x).detach()
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0) > 0.998


def test_layers_whose_sizes_the_kernel_refuses_stay_as_they_are():
    net = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 3))  # a 3-label head: not a multiple of 16
    assert quantize_linears(net, torch.bfloat16, make=Fp8Linear.quantize) == ["0"]
    assert isinstance(net[0], Fp8Linear) and isinstance(net[2], nn.Linear)


def test_a_cast_of_the_model_keeps_the_fp8_formats():
    layer = Fp8Linear.quantize(nn.Linear(32, 16), torch.float32)
    layer.to(torch.bfloat16)
    assert (layer.weight.dtype, layer.scales.dtype, layer.bias.dtype) == (E4M3, torch.float32, torch.bfloat16)


def test_fp8_weights_survive_the_engine_artifacts_file(tmp_path):
    from hotrod.models import get_family
    from tests.zoo import CASES

    config = CASES["gpt2"].config()
    config.n_embd, config.n_head = 64, 4  # widths the kernel takes
    family = get_family("gpt2")
    options = EngineOptions(device="cpu", precision="fp8")
    torch.manual_seed(0)
    module = family.build(config)
    for parameter in module.parameters():  # GPT-2's Conv1D starts uninitialised
        nn.init.normal_(parameter, std=0.05)
    module = prepare(module, options)
    assert isinstance(module.transformer.h[0].mlp.c_fc, Fp8Linear)
    static_engine.write_weights(module, tmp_path / static_engine.WEIGHTS)
    read = static_engine.read_weights(tmp_path / static_engine.WEIGHTS, family, config, options)
    for (name, stored), (_, back) in zip(module.state_dict().items(), read.state_dict().items(), strict=True):
        assert back.dtype == stored.dtype and torch.equal(back.float(), stored.float()), name


@pytest.mark.skipif(not _cpu_kernel(), reason="this torch has no CPU _scaled_mm with row-wise scales")
def test_the_layer_calls_the_kernel_as_the_reference_computes():
    """The engine runs fp8 only on its GPUs; this CPU build of the kernel checks the call's layout and scales."""
    torch.manual_seed(0)
    layer = Fp8Linear.quantize(nn.Linear(32, 48), torch.bfloat16)
    x = torch.randn(3, 5, 32).bfloat16()  # 15 rows: padded to 16 for the kernel
    expected = reference_linear(x, layer.weight, layer.scales, layer.bias)
    got = layer(x)
    assert got.shape == (3, 5, 48) and got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), expected.float(), rtol=2**-7, atol=2**-7)


def test_fp8_is_refused_off_its_gpus_with_the_reason():
    assert fp8.refusal("cpu") == ("fp8 runs through torch._scaled_mm on CUDA GPUs of compute capability 8.9 or "
                                  "newer (Ada, Hopper), not on cpu")


@no_gpu
def test_fp8_for_cuda_needs_a_cuda_device_here():
    assert fp8.refusal("cuda").endswith("and this torch sees no CUDA device")


@pytest.mark.skipif(fp8.refusal("cuda") is not None, reason="needs a GPU with fp8 tensor cores")
def test_on_a_gpu_with_fp8_the_kernel_matches_the_reference():
    torch.manual_seed(0)
    layer = Fp8Linear.quantize(nn.Linear(64, 32), torch.bfloat16).to("cuda")
    x = torch.randn(5, 64, device="cuda").bfloat16()
    expected = reference_linear(x, layer.weight, layer.scales, layer.bias)
    assert torch.allclose(layer(x).float(), expected.float(), rtol=2**-6, atol=2**-6)
