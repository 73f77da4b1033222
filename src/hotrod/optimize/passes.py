"""The pass pipeline for one exported graph: fusion, then quantization, written back in place."""

from __future__ import annotations

from pathlib import Path

import onnx

from hotrod.export.onnx import save_model
from hotrod.optimize.fusion import fuse
from hotrod.optimize.quantize import prune_initializers, quantize
from hotrod.registry import Dims


def optimize_graph(path: Path, optimizer_model_type: str | None, dims: Dims, precision: str) -> tuple[Path | None, dict]:
    """Rewrite `path`; returns its external data file (if any) and the pass report for the manifest."""
    model = onnx.load(str(path), load_external_data=True)
    report: dict = {"fused_ops": {}}
    if optimizer_model_type:
        model, report["fused_ops"] = fuse(model, optimizer_model_type, dims)
    model = prune_initializers(quantize(model, precision))
    for stale in path.parent.glob(path.name + ".data"):
        stale.unlink()
    return save_model(model, path), report
