"""Frozen option sets, one per stage, shared by the Python API and the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hotrod.errors import HotrodError
from hotrod.export.onnx import OPSET

# int8: dynamic (weights per-channel, activations per call); int8-static: QDQ with calibrated activation
# ranges; int8-weight and int4: weight-only block-quantized MatMulNBits; fp16/bf16: mixed precision.
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int8-static", "int8-weight", "int4")
# The torch backend's static engine (`hotrod.runtime.static`): its weights' precision.
ENGINE_PRECISIONS = ("fp32", "bf16", "fp16", "int8-weight")
CALIBRATION_METHODS = ("minmax", "percentile", "entropy")
AUTO = "auto"  # build every candidate precision, keep the fastest within the accuracy budget
BACKENDS = ("onnxruntime", "torch")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ExportOptions:
    """How an artifact is built. `device` is the device it is built for and loads on by default."""

    precision: str = "fp32"
    device: str = "cpu"
    opset: int = OPSET
    fusion: bool = True
    calibration_method: str = "minmax"  # for precisions that calibrate activation ranges (int8-static)

    def __post_init__(self):
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("device", self.device, DEVICES)
        check_choice("calibration method", self.calibration_method, CALIBRATION_METHODS)

    def to_dict(self) -> dict:
        return asdict(self)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise HotrodError(f"unknown {name} {value!r}; choose from {', '.join(choices)}")
    return value
