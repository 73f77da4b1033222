"""Engine precision: fp16 islands found by measurement, fp32 kept inside them, int8 weight-only linears."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotrod.errors import HotrodError
from hotrod.runtime.cast import Int8Linear, cast_module, overflowing_modules, quantize_linears


class Gated(nn.Module):
    """Small in and out, huge inside: the product of two projections (T5's gated feed-forward)."""

    def __init__(self, scale: float):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        with torch.no_grad():
            for layer in (self.a, self.b):
                layer.weight.mul_(scale)
                layer.bias.fill_(scale)
            self.out.weight.abs_().mul_(1.0 / (scale * scale))  # no cancellation: rounding stays relative

    def forward(self, x):
        return self.out(self.a(x) * self.b(x))


class Net(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.ff = Gated(scale)

    def forward(self, x):
        return x + self.ff(self.norm(x))


def test_the_overflowing_product_is_kept_in_fp32_with_its_enclosing_module():
    torch.manual_seed(0)
    net = Net(scale=1000.0).eval()
    x = torch.randn(2, 8)
    assert overflowing_modules(net, lambda: net(x)) == ["ff"]
    assert overflowing_modules(Net(scale=1.0).eval(), lambda: net(x)) == []


def test_an_fp16_model_with_its_island_in_fp32_stays_finite_and_close():
    torch.manual_seed(0)
    net = Net(scale=1000.0).eval()
    x = torch.randn(2, 8)
    expected = net(x)
    copy = Net(scale=1000.0).eval()
    copy.load_state_dict(net.state_dict())
    assert not copy.half()(x.half()).isfinite().all()  # the whole model in fp16 overflows
    half = Net(scale=1000.0).eval()
    half.load_state_dict(net.state_dict())
    half = cast_module(half, torch.float16, keep=["ff"])
    assert half.norm.weight.dtype == torch.float16 and half.ff.out.weight.dtype == torch.float32
    got = half(x.half())
    assert got.dtype == torch.float16 and got.isfinite().all()
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)


def test_overflow_at_the_models_own_edges_is_refused():
    net = nn.Sequential(nn.Linear(4, 4))
    with torch.no_grad():
        net[0].weight.fill_(1e5)
    with pytest.raises(HotrodError, match="use bf16"):
        overflowing_modules(net, lambda: net(torch.ones(1, 4)))


def test_int8_linear_is_close_to_its_source_and_stores_int8():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    q = Int8Linear.quantize(linear, torch.float32)
    x = torch.randn(4, 64)
    assert q.weight.dtype == torch.int8 and q.scales.shape == (32,)
    torch.testing.assert_close(q(x), linear(x), rtol=0.05, atol=0.05)


def test_quantize_linears_skips_what_it_is_told_and_rewires_fused_projections():
    from hotrod.models.common import FusedProjection

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
            self.qk = FusedProjection(self.q, self.k)

    attn = Attn()
    x = torch.randn(1, 8)
    before = [t.clone() for t in attn.qk(x)]
    assert quantize_linears(attn, torch.float32, skip=["head"]) == ["k", "q"]
    assert isinstance(attn.head, nn.Linear)
    assert all(isinstance(layer, Int8Linear) for layer in attn.qk.layers)
    for got, want in zip(attn.qk(x), before):
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)


def test_gpt2s_transposed_layers_are_quantized_as_linears():
    from hotrod.models.common import Conv1D

    torch.manual_seed(0)
    layer = Conv1D(16, 24)  # weight [in, out]
    nn.init.normal_(layer.weight, std=0.1)
    net, x = nn.Sequential(layer), torch.randn(2, 3, 16)
    expected = layer(x).detach()
    assert quantize_linears(net, torch.float32) == ["0"]
    assert isinstance(net[0], Int8Linear) and net[0].weight.shape == (24, 16)
    torch.testing.assert_close(net(x), expected, rtol=0.05, atol=0.05)
