"""ONNX Runtime backend with IO binding.

Each run binds its outputs to ORT-allocated buffers and returns the OrtValues themselves; the next step
binds those same OrtValues as its past inputs, so the KV cache is never copied through numpy. Only
logits (and hidden states) are read back into torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from hotrod.errors import HotrodError, first_line
from hotrod.export.io import GraphIO
from hotrod.runtime.base import RuntimeOptions, cpu_threads, missing_inputs

_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


def providers_for(device: str) -> list[str]:
    if device not in _PROVIDERS:
        raise HotrodError(f"unknown device {device!r}; choose from {', '.join(_PROVIDERS)}")
    wanted = _PROVIDERS[device]
    if wanted[0] not in ort.get_available_providers():
        raise HotrodError(
            f"device {device!r} needs onnxruntime's {wanted[0]}, which this onnxruntime does not have "
            f"(available: {', '.join(ort.get_available_providers())})"
        )
    return wanted


class OrtBackend:
    def __init__(self, files: dict[str, Path], contracts: dict[str, GraphIO], options: RuntimeOptions):
        self.contracts = contracts
        self.device = "cpu" if options.device == "cpu" else "cuda"
        self.loop_threads = 1 if self.device == "cpu" else None
        providers = providers_for(options.device)
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.intra_op_num_threads = cpu_threads(options.threads)
        session_options.inter_op_num_threads = 1
        session_options.log_severity_level = 3
        self.sessions = {name: _open(path, session_options, providers) for name, path in files.items()}
        _check_placement(self.sessions, options.device)

    def run(self, graph: str, feeds: Mapping[str, Any], into: Mapping[str, Any] | None = None) -> dict[str, Any]:
        io = self.contracts[graph]
        missing = missing_inputs(io, feeds)
        if missing:
            raise KeyError(f"graph {graph} needs inputs {missing}")
        binding = self.sessions[graph].io_binding()
        # The binding holds only the native value, and a value made from numpy does not own its buffer:
        # the Python handles must outlive the run, or a copied feed (a non-contiguous slice) is freed early.
        handles = [self._handle(feeds[name]) for name in io.input_names]
        for name, handle in zip(io.input_names, handles):
            binding.bind_ortvalue_input(name, handle)
        into = into or {}
        for name in io.output_names:
            if name in into:  # the same OrtValue as an input: onnxruntime's kernels then update it in place
                binding.bind_ortvalue_output(name, into[name])
            else:
                binding.bind_output(name, self.device)
        self.sessions[graph].run_with_iobinding(binding)
        return dict(zip(io.output_names, binding.get_outputs()))

    def empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        # Zeros, not whatever memory held: calibration records cache buffers as feeds, and the precision
        # search would read stale bits there as overflowing activations. calloc'd pages cost nothing up front.
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=np.float32), self.device, 0)

    def to_torch(self, value: Any) -> torch.Tensor:
        # numpy() is a view of ORT's buffer that does not keep it alive; the copy outlives the handle.
        return torch.from_numpy(value.numpy().copy())

    def view(self, value: Any) -> torch.Tensor:
        return torch.from_numpy(value.numpy()) if isinstance(value, ort.OrtValue) else value

    def select(self, value: Any, index: torch.Tensor) -> Any:
        return self._handle(torch.from_numpy(value.numpy()[index.cpu().numpy()]))

    def _handle(self, value: Any) -> ort.OrtValue:
        if isinstance(value, ort.OrtValue):
            return value
        array = np.ascontiguousarray(value.detach().cpu().numpy())
        # The OrtValue keeps a reference to `array`, so the buffer lives as long as the handle.
        return ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)


def _check_placement(sessions: dict[str, ort.InferenceSession], device: str) -> None:
    """onnxruntime falls back to its CPU provider when a GPU provider's libraries fail to load; asked for a
    GPU, running on the CPU unannounced would be wrong answers about speed, so it is refused."""
    if device == "cpu":
        return
    on_cpu = [name for name, session in sessions.items() if session.get_providers()[0] == "CPUExecutionProvider"]
    if on_cpu:
        raise HotrodError(f"device {device!r}: onnxruntime could not start its GPU provider (its libraries failed "
                          f"to load) and would run {', '.join(on_cpu)} on the CPU")


def _open(path: Path, options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # noqa: BLE001  (ORT raises its own exception types for a bad file)
        raise HotrodError(f"cannot load graph {path.name}: {first_line(exc)}") from None
