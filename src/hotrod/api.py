"""The Python API: `optimize` writes an artifact, `load` returns a drop-in model.

The CLI is a thin layer over these two functions.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

from hotrod import artifact as art
from hotrod.errors import HotrodError
from hotrod.export import export_graph, graph_contracts
from hotrod.load import (
    Source,
    cache_dir,
    load_generation_config,
    load_state_dict,
    load_tokenizer,
    open_source,
    read_config,
    source_fingerprint,
    weights_sha256,
)
from hotrod.model import HotrodModel
from hotrod.optimize import optimize_graph
from hotrod.optimize.quantize import describe as describe_precision
from hotrod.options import BACKENDS, DEVICES, ExportOptions, check_choice
from hotrod.registry import get_family
from hotrod.runtime.base import RuntimeOptions


def optimize(
    source: str | Path,
    out: str | Path,
    precision: str = "fp32",
    backend: str = "onnxruntime",
    device: str = "cpu",
    force: bool = False,
    progress: bool = True,
    fusion: bool = True,
) -> Path:
    """Export `source` (a checkpoint directory or hub id) to an artifact directory `out`; returns its path.

    Each graph is exported, fused (unless `fusion=False`) and quantized to `precision` (fp32, int8, int4).
    """
    options = ExportOptions(precision=precision, device=device, fusion=fusion)
    if check_choice("backend", backend, BACKENDS) != "onnxruntime":
        raise HotrodError("optimize writes ONNX graphs for the onnxruntime backend; "
                          "run a checkpoint in PyTorch with hotrod.load(source, backend='torch')")
    out = Path(out)
    src = open_source(source)
    if out.resolve() == src.path.resolve() or out.resolve() in src.path.resolve().parents:
        raise HotrodError(f"--out {out} would replace the source checkpoint {src.path}; choose another directory")
    with art.staging(out, force) as tmp:
        module = build_module(src)
        dims = src.family.dims(src.config)
        contracts = graph_contracts(src.family.kind, dims)
        graphs = module.graphs()
        entries = {}
        for name, io in _progress(contracts.items(), progress, "export + optimize", len(contracts)):
            export_graph(graphs[name], io, dims.vocab_size, tmp / f"{name}.onnx")
            optimizer = src.family.onnx_optimizer if options.fusion else None
            external, report = optimize_graph(tmp / f"{name}.onnx", optimizer, dims, options.precision)
            entries[name] = {
                **art.file_entry(tmp, f"{name}.onnx"),
                "external_data": art.file_entry(tmp, external.name) if external else None,
                "inputs": [t.to_dict() for t in io.inputs],
                "outputs": [t.to_dict() for t in io.outputs],
                **report,
            }
        del module
        files = _write_configs(src, tmp)
        art.write_manifest(tmp, {
            "source": {"origin": src.origin, "path": str(src.path.resolve()), "from_hub": src.from_hub,
                       "weights_sha256": weights_sha256(src.path)},
            "family": src.family.name,
            "model_type": src.config.model_type,
            "kind": src.family.kind,
            "dims": dims.to_dict(),
            "options": options.to_dict(),
            "weights": describe_precision(options.precision),
            "versions": _versions(),
            "graphs": entries,
            "files": files,
        })
    return out


def load(
    path_or_source: str | Path,
    backend: str = "onnxruntime",
    device: str | None = None,
    threads: int = 0,
) -> HotrodModel:
    """A drop-in model from an artifact, or from a checkpoint (exported on first use for onnxruntime)."""
    check_choice("backend", backend, BACKENDS)
    if device is not None:
        check_choice("device", device, DEVICES)
    if art.is_artifact(path_or_source):
        return _load_artifact(art.open_artifact(path_or_source), backend, device, threads)
    src = open_source(path_or_source)
    options = RuntimeOptions(backend=backend, device=device or "cpu", threads=threads)
    if backend == "torch":
        return _torch_model(src, options, load_tokenizer(src.path))
    cached = cache_dir() / f"{src.family.name}-{source_fingerprint(src.path)[:20]}-fp32"
    try:
        artifact = art.open_artifact(cached)
    except HotrodError:  # not exported yet, or by an older hotrod, or damaged: export afresh
        optimize(src.origin if src.from_hub else src.path, cached, force=True, progress=sys.stderr.isatty())
        artifact = art.open_artifact(cached)
    return _load_artifact(artifact, backend, device, threads)


def build_module(src: Source) -> torch.nn.Module:
    """The family's lean module with the checkpoint's weights, in eval mode."""
    module = src.family.build(src.config)
    module.load_hf(load_state_dict(src.path))
    return module.eval()


def _load_artifact(artifact: art.Artifact, backend: str, device: str | None, threads: int) -> HotrodModel:
    config = read_config(artifact.path)
    family = get_family(config.model_type)
    device = device or artifact.manifest["options"].get("device", "cpu")
    options = RuntimeOptions(backend=backend, device=device, threads=threads)
    tokenizer = load_tokenizer(artifact.path)
    if backend == "torch":
        return _torch_model(_artifact_source(artifact), options, tokenizer)
    from hotrod.runtime.ort import OrtBackend

    dims = family.dims(config)
    contracts = graph_contracts(family.kind, dims)
    ort_backend = OrtBackend(artifact.graph_files, contracts, options)
    return HotrodModel(family, config, ort_backend, load_generation_config(artifact.path, config), tokenizer,
                       manifest=artifact.manifest)


def _torch_model(src: Source, options: RuntimeOptions, tokenizer) -> HotrodModel:
    from hotrod.runtime.torch import TorchBackend

    if options.device == "cuda" and not torch.cuda.is_available():
        raise HotrodError("device 'cuda' asked for, but this torch has no CUDA device")
    dims = src.family.dims(src.config)
    contracts = graph_contracts(src.family.kind, dims)
    backend = TorchBackend(build_module(src), contracts, options)
    return HotrodModel(src.family, src.config, backend, load_generation_config(src.path, src.config), tokenizer)


def _artifact_source(artifact: art.Artifact) -> Source:
    """The torch backend runs checkpoint weights; an artifact names its source and the weights' hash."""
    recorded = artifact.manifest["source"]
    path = Path(recorded["path"])
    if not path.is_dir() or weights_sha256(path) != recorded["weights_sha256"]:
        raise HotrodError(
            f"the torch backend needs the checkpoint this artifact was made from ({recorded['origin']}), "
            "which is no longer where it was or has changed; load the checkpoint itself with backend='torch'"
        )
    return open_source(path)


def _write_configs(src: Source, out: Path) -> dict:
    """Copy config.json, write generation_config.json and the tokenizer; returns their manifest entries."""
    shutil.copyfile(src.path / "config.json", out / "config.json")
    load_generation_config(src.path, src.config).save_pretrained(out)
    tokenizer = load_tokenizer(src.path)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    names = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.endswith((".onnx", ".data")))
    return {name: art.file_entry(out, name) for name in names}


def _versions() -> dict:
    import onnx
    import onnxruntime
    import tokenizers
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def _progress(items, enabled: bool, desc: str, total: int):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, unit="graph", file=sys.stderr)
