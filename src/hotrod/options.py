"""Frozen option sets, one per stage, shared by the Python API and the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hotrod.errors import HotrodError
from hotrod.export.onnx import OPSET

PRECISIONS = ("fp32", "int8", "int4")
BACKENDS = ("onnxruntime", "torch")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ExportOptions:
    """How an artifact is built. `device` is the device it is built for and loads on by default."""

    precision: str = "fp32"
    device: str = "cpu"
    opset: int = OPSET
    fusion: bool = True

    def __post_init__(self):
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("device", self.device, DEVICES)

    def to_dict(self) -> dict:
        return asdict(self)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise HotrodError(f"unknown {name} {value!r}; choose from {', '.join(choices)}")
    return value
