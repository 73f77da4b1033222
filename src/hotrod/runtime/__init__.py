"""Backends: one small interface (`base.Backend`), an ONNX Runtime and an eager PyTorch implementation."""

from hotrod.runtime.base import Backend, RuntimeOptions

__all__ = ["Backend", "RuntimeOptions"]
