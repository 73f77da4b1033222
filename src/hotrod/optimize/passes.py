"""The passes one exported graph goes through; `hotrod.build.graphs` runs them, in its one pass order.

`fuse_graph` runs on the fp32 export; `lower_graph` then applies the precision (`hotrod.precisions`):
mixed precision (fp16/bf16) or quantization (int8 dynamic or static, int8/int4 weight-only). Each
rewrites the file in place and returns its external data file (if any) and what it did, for the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from hotrod.export.onnx import save_model
from hotrod.optimize.fusion import fuse
from hotrod.registry import Dims

if TYPE_CHECKING:  # specs are passed in: `hotrod.precisions` lowers through these passes, never the reverse
    from hotrod.precisions import Precision


def fuse_graph(path: Path, optimizer_model_type: str, dims: Dims, device: str = "cpu",
               steps: bool = False) -> tuple[Path | None, dict]:
    """Fuse one graph (`steps`: it runs every decoding step; see `hotrod.optimize.fusion.fuse`)."""
    model, counts = fuse(_read(path), optimizer_model_type, dims, device, steps)
    return _write(model, path), {"fused_ops": counts}


def note_fp32_ops(path: Path, ops: tuple[str, ...]) -> None:
    """Record in the graph's metadata the operators its family keeps in fp32 under half precision, so that
    lowering it later (`hotrod.optimize.mixed`) needs nothing but the graph."""
    from hotrod.optimize.mixed import FP32_OPS_KEY

    model = onnx.load(str(path), load_external_data=False)  # external weights stay where they are
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, FP32_OPS_KEY: ",".join(ops)})
    onnx.save_model(model, str(path))


def portable_graph(path: Path) -> tuple[Path | None, dict]:
    """Rewrite in-place attention into ops a GPU provider runs in fp32 (`hotrod.optimize.portable`)."""
    from hotrod.optimize.portable import has_in_place_attention, portable_attention

    model = _read(path)
    if not has_in_place_attention(model):
        return _external(path), {}
    model, counts = portable_attention(model)
    return _write(model, path), {"fused_ops": counts}


def cpu_attention_graph(path: Path) -> tuple[Path | None, dict] | None:
    """ONNX's Attention for the graph's plain self-attention (`hotrod.optimize.fusion.onnx_attention`):
    the new external data file (if any) and fused-op counts, or None where nothing changed."""
    from hotrod.optimize.fusion import fused_op_counts, onnx_attention

    if "MultiHeadAttention" not in {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}:
        return None  # the common case (decoding steps), told without reading the weights
    model = _read(path)
    before = fused_op_counts(model)
    model = onnx_attention(model)
    counts = fused_op_counts(model)
    if counts == before:
        return None
    return _write(model, path), {"fused_ops": counts}


def lower_graph(path: Path, precision: Precision, feeds: list[dict[str, np.ndarray]] | None = None,
                method: str = "minmax") -> tuple[Path | None, dict]:
    """Apply `precision` to one fp32 graph; `feeds` are its recorded inputs, for precisions that need them."""
    if not precision.converts:
        return _external(path), {}
    model, report = precision.lower(_read(path), feeds, method, name=path.stem)
    return _write(model, path), report


def _read(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=True)


def _write(model: onnx.ModelProto, path: Path) -> Path | None:
    for stale in path.parent.glob(path.name + ".data"):
        stale.unlink()
    return save_model(model, path)


def _external(path: Path) -> Path | None:
    data = path.with_name(path.name + ".data")
    return data if data.is_file() else None
