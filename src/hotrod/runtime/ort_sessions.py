"""onnxruntime sessions as hotrod opens them: the providers a device asks for, the session's settings, and a
refusal where a GPU provider did not start."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from hotrod.errors import HotrodError, first_line
from hotrod.runtime.base import RuntimeOptions, cpu_threads

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


def session_options(options: RuntimeOptions, profile_prefix: Path | None = None) -> ort.SessionOptions:
    """A session's settings; `profile_prefix`: where onnxruntime's profiler writes, None for no profiling."""
    settings = ort.SessionOptions()
    settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    settings.intra_op_num_threads = cpu_threads(options.threads)
    settings.inter_op_num_threads = 1
    settings.log_severity_level = 3
    # Worker threads spin between the parallel parts of a run and stop when it returns: spinning on after
    # it, they would take the cores the decoding loop's own work needs until the next step, while turning
    # spinning off altogether slows the parts of a run.
    settings.add_session_config_entry("session.force_spinning_stop", "1")
    if profile_prefix is not None:
        settings.enable_profiling = True
        settings.profile_file_prefix = str(profile_prefix)
    return settings


def check_placement(sessions: dict[str, ort.InferenceSession], device: str) -> None:
    """onnxruntime falls back to its CPU provider when a GPU provider's libraries fail to load; asked for a
    GPU, running on the CPU unannounced would be wrong answers about speed, so it is refused."""
    if device == "cpu":
        return
    on_cpu = [name for name, session in sessions.items() if session.get_providers()[0] == "CPUExecutionProvider"]
    if on_cpu:
        raise HotrodError(f"device {device!r}: onnxruntime could not start its GPU provider (its libraries failed "
                          f"to load) and would run {', '.join(on_cpu)} on the CPU")


# Session-level passes left out on the CPU: BiasGeluFusion turns an encoder's bias Add + Gelu (kept apart by
# `hotrod.optimize.fusion`) back into BiasGelu, whose CPU kernel is the slower (the same outputs to the bit;
# a cross-encoder's batches run faster without it). SkipLayerNormFusion would fuse a residual Add and its
# LayerNormalization, kept apart for the same reason, wherever it can infer their shapes: in an int8 encoder
# at most the first layer's, and none where hotrod's kernel quantizes a product's input (`hotrod.runtime.rows`;
# no shapes are inferred through a custom op), whose answers would then differ from onnxruntime's ops' by
# that one sum's rounding.
CPU_DISABLED_OPTIMIZERS = ["BiasGeluFusion", "SkipLayerNormFusion"]


def open_session(path: Path, options: ort.SessionOptions, providers: list[str],
                 rewritten: Path | None = None) -> ort.InferenceSession:
    """A session of the graph at `path`, or of `rewritten`, that graph rewritten."""
    disabled = CPU_DISABLED_OPTIMIZERS if providers[0] == "CPUExecutionProvider" else None
    try:
        return ort.InferenceSession(str(rewritten or path), sess_options=options, providers=providers,
                                    disabled_optimizers=disabled)
    except Exception as exc:  # noqa: BLE001  (ORT raises its own exception types for a bad file)
        raise HotrodError(f"cannot load graph {path.name}: {first_line(exc)}") from None
