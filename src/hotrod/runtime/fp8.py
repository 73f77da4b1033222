"""fp8 weights for the static engine: e4m3 with one scale per output channel, multiplied by torch._scaled_mm.

Each weight row is scaled so that its largest magnitude lands on e4m3's largest finite value (448) and
rounded to e4m3 (3 mantissa bits). At run time each row of activations (a token) is scaled and rounded
the same way, and `torch._scaled_mm` multiplies the two fp8 operands on the tensor cores, accumulates in
fp32 and applies both scales (row-wise scaling), returning bf16. A batch-1 decoding step reads every
weight once per token, so one byte a weight halves what bf16 reads, as int8-weight does, and the matmul
itself runs at the fp8 rate.

That needs fp8 tensor cores: CUDA compute capability 8.9 (Ada) or 9.0 (Hopper) and newer, and a torch
with `_scaled_mm`; `refusal` says why not elsewhere, and `Fp8Linear` calls the kernel only there. The
arithmetic itself (`quantize`, `dequantize`, `reference_linear`) is plain torch and runs on any device,
which is how it is tested on a CPU.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3 = getattr(torch, "float8_e4m3fn", None)
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
CAPABILITY = (8, 9)  # Ada; Hopper is 9.0
ALIGN = 16  # cuBLASLt's fp8 matmul wants every dimension a multiple of 16
KERNEL = "torch._scaled_mm on CUDA GPUs of compute capability 8.9 or newer (Ada, Hopper)"


def refusal(device: str) -> str | None:
    """Why fp8 cannot run on `device` here, or None when torch and the GPU have the kernel."""
    if device != "cuda":
        return f"fp8 runs through {KERNEL}, not on {device}"
    if E4M3 is None or not hasattr(torch, "_scaled_mm"):
        return f"fp8 runs through {KERNEL}, and torch {torch.__version__} has no float8 matmul"
    if not torch.cuda.is_available():
        return f"fp8 runs through {KERNEL}, and this torch sees no CUDA device"
    capability = torch.cuda.get_device_capability()
    if capability < CAPABILITY:
        return (f"fp8 runs through {KERNEL}; the GPU here ({torch.cuda.get_device_name()}) has compute "
                f"capability {capability[0]}.{capability[1]}")
    return None


def quantize(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` [..., K] as e4m3 and one fp32 scale per row [...]: rows ~= e4m3 * scale[..., None]."""
    wide = rows.float()
    scales = wide.abs().amax(dim=-1).clamp(min=1e-12) / E4M3_MAX
    return (wide / scales[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scales


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 rows `quantize` stands for."""
    return values.float() * scales[..., None]


def reference_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """What `Fp8Linear` computes, in fp32 on any device: activations rounded to e4m3 per row, products of
    the rounded operands summed in fp32, both scales applied; in x's dtype."""
    values, row_scales = quantize(x.reshape(-1, x.shape[-1]))
    out = (dequantize(values, row_scales) @ dequantize(weight, scales).t()).reshape(*x.shape[:-1], -1)
    return (out if bias is None else out + bias.float()).to(x.dtype)


class Fp8Linear(nn.Module):
    """A linear layer with e4m3 weights [out, in] and fp32 scales [out], run by torch._scaled_mm."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self.out_features, self.in_features = weight.shape

    @classmethod
    def quantize(cls, linear: nn.Linear, dtype: torch.dtype) -> Fp8Linear | None:
        """`linear` in fp8, or None (left as it is) where a dimension does not suit the kernel."""
        if linear.in_features % ALIGN or linear.out_features % ALIGN:
            return None
        weight, scales = quantize(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(weight, scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        if count % ALIGN:
            rows = torch.nn.functional.pad(rows, (0, 0, 0, ALIGN - count % ALIGN))
        values, row_scales = quantize(rows)
        out = torch._scaled_mm(values, self.weight.t(), scale_a=row_scales[:, None], scale_b=self.scales[None, :],
                               out_dtype=x.dtype)
        out = out[:count].reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def _apply(self, fn, recurse=True):
        """Moves with the model, but keeps its formats: a model-wide cast to bf16 must neither widen the
        e4m3 weight nor round the fp32 scales. The bias follows the model."""
        for name in ("weight", "scales"):
            value = self._buffers[name]
            self._buffers[name] = value.to(fn(value.new_empty(0)).device)
        bias = self._buffers["bias"]
        if bias is not None:
            self._buffers["bias"] = fn(bias)
        return self
