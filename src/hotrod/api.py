"""The Python API: `optimize` writes an artifact, `load` returns a drop-in model.

The CLI is a thin layer over these two functions.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from hotrod import artifact as art
from hotrod import build
from hotrod.build import build_module
from hotrod.contracts import graph_contracts
from hotrod.errors import HotrodError
from hotrod.load import (
    Source,
    cache_dir,
    load_generation_config,
    load_tokenizer,
    open_source,
    read_config,
    source_fingerprint,
    weights_sha256,
)
from hotrod.model import HotrodModel
from hotrod.optimize.calibration import Feeds, builtin_texts, capture_feeds, read_texts
from hotrod.optimize.passes import HALF
from hotrod.optimize.portable import IN_PLACE_OP
from hotrod.optimize.precision import half_supported
from hotrod.optimize.quantize import NEEDS_CALIBRATION
from hotrod.options import AUTO, BACKENDS, DEVICES, ENGINE_PRECISIONS, ExportOptions, check_choice
from hotrod.registry import get_family
from hotrod.runtime.base import RuntimeOptions
from hotrod.verify import DEFAULT_EXAMPLES, Example, builtin_examples, compare, read_examples

NEEDS_FEEDS = frozenset(HALF) | NEEDS_CALIBRATION


def optimize(
    source: str | Path,
    out: str | Path,
    precision: str = "fp32",
    backend: str = "onnxruntime",
    device: str = "cpu",
    force: bool = False,
    progress: bool = True,
    fusion: bool = True,
    calibration: str | Path | Sequence[str] | None = None,
    calibration_method: str = "minmax",
    verify_texts: str | Path | Sequence[str | Example] | None = None,
    verify_examples: int = 32,
    max_drop: float = 0.01,
) -> Path:
    """Export `source` (a checkpoint directory or hub id) to an artifact directory `out`; returns its path.

    Every graph is exported and fused (unless `fusion=False`), then lowered to `precision` (see
    `hotrod.options.PRECISIONS`, or "auto"). Precisions that calibrate record real feeds from the fp32
    model on `calibration` texts (a file, a list, or the built-in set). The result is verified against the
    source on `verify_examples` examples (0 skips it) and the figures are stored in manifest.json. With
    "auto", every candidate is built, verified and timed, and the fastest whose score drops at most
    `max_drop` below the source's is kept; the manifest's "auto" section holds the whole table.
    """
    auto = precision == AUTO
    options = ExportOptions(precision="fp32" if auto else precision, device=device, fusion=fusion,
                            calibration_method=calibration_method)
    if options.precision in HALF and device == "cpu" and not half_supported(options.precision, "cpu"):
        raise HotrodError(f"onnxruntime's CPU provider has no {options.precision} kernels, so {options.precision} "
                          "on cpu would only be slower; build it with --device cuda, or choose int8/int4 for CPU")
    if check_choice("backend", backend, BACKENDS) != "onnxruntime":
        raise HotrodError("optimize writes ONNX graphs for the onnxruntime backend; "
                          "run a checkpoint in PyTorch with hotrod.load(source, backend='torch')")
    if verify_examples < 0 or (auto and verify_examples == 0):
        raise HotrodError("verify_examples must be >= 1 with precision 'auto' (and >= 0 otherwise)")
    if auto and device != "cpu" and not _has_device(device):
        raise HotrodError(f"--precision auto times every candidate on the device, and {device} is not available here")
    if not 0 <= max_drop <= 1:
        raise HotrodError(f"max_drop must be between 0 and 1, got {max_drop}")
    texts = _calibration_texts(calibration)  # a bad file fails before any work
    examples = _examples(verify_texts)[:verify_examples]
    out = Path(out)
    src = open_source(source)
    if out.resolve() == src.path.resolve() or out.resolve() in src.path.resolve().parents:
        raise HotrodError(f"--out {out} would replace the source checkpoint {src.path}; choose another directory")
    with art.staging(out, force) as tmp:
        entries = build.export_graphs(src, tmp, options.fusion, progress, options.device)
        files = build.write_configs(src, tmp)
        described = build.describe_source(src)
        art.write_manifest(tmp, build.manifest(described, options, entries, files))
        reference = _torch_model(src, RuntimeOptions(backend="torch"), load_tokenizer(src.path)) if examples else None
        lowered = _Lowering(described, options, tmp, entries, files, texts, progress)
        if auto:
            options, entries, extra = _auto(lowered, reference, examples, max_drop, progress)
        else:
            entries, extra = lowered.apply(precision, tmp), {}
        art.write_manifest(tmp, build.manifest(described, options, entries, files, **extra))
        if examples:
            runs_on = device if device == "cpu" or _has_device(device) else "cpu"
            model = _load_artifact(art.open_artifact(tmp), "onnxruntime", runs_on, 0)
            extra["verification"] = {"against": src.origin, "examples_from": _origin(verify_texts), "device": runs_on,
                                     **(extra.pop("figures", None) or compare(model, reference, examples))}
        else:
            extra["verification"] = None
        art.write_manifest(tmp, build.manifest(described, options, entries, files, **extra))
    return out


def _has_device(device: str) -> bool:
    """Whether onnxruntime here can run on `device`; an artifact built for another machine is verified on CPU."""
    from hotrod.runtime.ort import providers_for

    try:
        providers_for(device)
    except HotrodError:
        return False
    return True


class _Lowering:
    """Lowers the fp32 export in `base` to a precision in some directory, calibrating once if needed."""

    def __init__(self, described: dict, options: ExportOptions, base: Path, entries: dict, files: dict,
                 texts: list[str], progress: bool):
        self.described, self.options, self.base, self.entries, self.files = described, options, base, entries, files
        self.texts, self.progress = texts, progress
        self._feeds: Feeds | None = None

    def feeds(self) -> Feeds:
        if self._feeds is None:
            model = _load_artifact(art.open_artifact(self.base), "onnxruntime", "cpu", 0)
            self._feeds = capture_feeds(model, self.texts)
        return self._feeds

    def apply(self, precision: str, directory: Path) -> dict:
        """Lower the graphs in `directory` (a copy of the fp32 export, or the export itself)."""
        feeds = self.feeds() if precision in NEEDS_FEEDS else None
        return build.lower(directory, self.entries, precision, feeds, self.options.calibration_method, self.progress)

    def build(self, precision: str, directory: Path) -> Path:
        build.copy_graphs(self.base, directory)
        entries = self.apply(precision, directory)
        options = replace(self.options, precision=precision)
        art.write_manifest(directory, build.manifest(self.described, options, entries, self.files))
        return directory


def _auto(lowered: _Lowering, reference, examples, max_drop: float, progress: bool) -> tuple[ExportOptions, dict, dict]:
    """Choose the precision, move the winner's graphs into the staging directory, and describe the choice."""
    from hotrod import auto

    device = lowered.options.device
    workdir = Path(tempfile.mkdtemp(prefix=".auto.", dir=lowered.base))
    try:
        winner, table = auto.choose(lowered.build, lambda p: _load_artifact(art.open_artifact(p), "onnxruntime",
                                                                           device, 0),
                                    reference, examples, auto.candidates(device), max_drop, workdir, progress)
        chosen = workdir / winner.precision
        entries = json.loads((chosen / art.MANIFEST).read_text())["graphs"]
        for name in {e["file"] for e in lowered.entries.values()} | {p.name for p in lowered.base.glob("*.onnx.data")}:
            (lowered.base / name).unlink(missing_ok=True)
        for file in chosen.iterdir():
            if file.name.endswith(build.GRAPH_SUFFIXES):
                shutil.move(str(file), lowered.base / file.name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = {"max_drop": max_drop, "chosen": winner.precision, "score": (winner.figures or {}).get("score_name"),
               "candidates": [c.row() for c in table]}
    return replace(lowered.options, precision=winner.precision), entries, {"auto": section, "figures": winner.figures}


def _calibration_texts(calibration) -> list[str]:
    if calibration is None:
        return builtin_texts()
    if isinstance(calibration, (str, Path)):
        return read_texts(calibration)
    texts = [t.strip() for t in calibration if isinstance(t, str) and t.strip()]
    if not texts:
        raise HotrodError("calibration texts are empty")
    return texts


def _examples(verify_texts) -> list[Example]:
    if verify_texts is None:
        return builtin_examples()
    if isinstance(verify_texts, (str, Path)):
        return read_examples(verify_texts)
    examples = [e if isinstance(e, Example) else Example(str(e)) for e in verify_texts]
    if not examples:
        raise HotrodError("verification examples are empty")
    return examples


def _origin(texts) -> str:
    if texts is None:
        return "built-in texts"
    return str(texts) if isinstance(texts, (str, Path)) else "given examples"


def load(
    path_or_source: str | Path,
    backend: str = "onnxruntime",
    device: str | None = None,
    threads: int = 0,
    precision: str | None = None,
    static: bool | None = None,
) -> HotrodModel:
    """A drop-in model from an artifact, or from a checkpoint (exported on first use for onnxruntime).

    On the torch backend a GPU runs the static engine (`hotrod.runtime.static`), in `precision` (fp32,
    bf16, fp16, int8-weight; fp32 when not given); `static=True` runs it on a CPU too.
    """
    check_choice("backend", backend, BACKENDS)
    if device is not None:
        check_choice("device", device, DEVICES)
    options = _runtime_options(backend, device or "cpu", threads, precision, static)
    if art.is_artifact(path_or_source):
        return _load_artifact(art.open_artifact(path_or_source), backend, device, threads)
    src = open_source(path_or_source)
    if backend == "torch":
        return _torch_model(src, options, load_tokenizer(src.path))
    built_for = options.device  # graphs differ by device (`hotrod.optimize.portable`)
    cached = cache_dir() / f"{src.family.name}-{source_fingerprint(src.path)[:20]}-fp32"
    if built_for != "cpu":
        cached = cached.with_name(f"{cached.name}-{built_for}")
    try:
        artifact = art.open_artifact(cached)
    except HotrodError:  # not exported yet, or by an older hotrod, or damaged: export afresh
        optimize(src.origin if src.from_hub else src.path, cached, force=True, progress=sys.stderr.isatty(),
                 verify_examples=0, device=built_for)  # a cache for load(); `hotrod verify` measures it on request
        artifact = art.open_artifact(cached)
    return _load_artifact(artifact, backend, device, threads)


def _runtime_options(backend: str, device: str, threads: int, precision: str | None,
                     static: bool | None) -> RuntimeOptions:
    options = RuntimeOptions(backend=backend, device=device, threads=threads, precision=precision or "fp32",
                             static=static)
    if precision is None:
        return options
    if backend != "torch":
        raise HotrodError("precision applies to the torch backend; an onnxruntime artifact's precision is chosen "
                          "when it is built (hotrod optimize --precision)")
    check_choice("torch precision", precision, ENGINE_PRECISIONS)
    if precision != "fp32" and not options.uses_static_engine:
        raise HotrodError(f"precision {precision} is the static engine's, which runs on --device cuda "
                          "(from Python, static=True runs it on a CPU)")
    return options


def verify(
    path: str | Path,
    against: str | Path | None = None,
    texts: str | Path | Sequence[str | Example] | None = None,
    examples: int = DEFAULT_EXAMPLES,
    max_new_tokens: int | None = None,
    threads: int = 0,
) -> dict:
    """Compare an artifact with its source model (or the checkpoint `against`); returns the figures.

    See `hotrod.verify` for what is measured. `texts` is a file of examples (`input[<TAB>target]` per
    line), a list, or None for the built-in texts; the first `examples` of them are used.
    """
    if examples < 1:
        raise HotrodError(f"examples must be >= 1, got {examples}")
    if not art.is_artifact(path):
        raise HotrodError(f"{path} is not a hotrod artifact (no manifest.json); verify checks an artifact")
    chosen = _examples(texts)[:examples]
    artifact = art.open_artifact(path)
    model = _load_artifact(artifact, "onnxruntime", None, threads)
    src = _artifact_source(artifact) if against is None else open_source(against)
    if src.family.dims(src.config) != model.dims:
        raise HotrodError(f"{src.origin} is not the model of {path} (its dimensions differ)")
    reference = _torch_model(src, RuntimeOptions(backend="torch", threads=threads), model.tokenizer)
    figures = compare(model, reference, chosen, max_new_tokens=max_new_tokens)
    return {"against": src.origin, "examples_from": _origin(texts), **figures}


def _load_artifact(artifact: art.Artifact, backend: str, device: str | None, threads: int) -> HotrodModel:
    config = read_config(artifact.path)
    family = get_family(config.model_type)
    device = device or artifact.manifest["options"].get("device", "cpu")
    options = RuntimeOptions(backend=backend, device=device, threads=threads)
    tokenizer = load_tokenizer(artifact.path)
    if backend == "torch":
        return _torch_model(_artifact_source(artifact), options, tokenizer)
    from hotrod.runtime.ort import OrtBackend

    _check_built_for(artifact, device)
    dims = family.dims(config)
    contracts = graph_contracts(family.kind, dims)
    ort_backend = OrtBackend(artifact.graph_files, contracts, options)
    return HotrodModel(family, config, ort_backend, load_generation_config(artifact.path, config), tokenizer,
                       manifest=artifact.manifest)


def _check_built_for(artifact: art.Artifact, device: str) -> None:
    """A CPU build's in-place attention has no fp32 kernel on GPUs (`hotrod.optimize.portable`): refused,
    rather than left to run on the CPU behind the GPU's back."""
    graphs = artifact.manifest.get("graphs", {})
    in_place = [name for name, entry in graphs.items() if (entry.get("fused_ops") or {}).get(IN_PLACE_OP)]
    if device != "cpu" and in_place:
        raise HotrodError(f"{artifact.path} was built for the CPU: its {', '.join(in_place)} graph's in-place "
                          f"attention has no {device} kernel in fp32; rebuild it with `hotrod optimize --device {device}`")


def _torch_model(src: Source, options: RuntimeOptions, tokenizer) -> HotrodModel:
    from hotrod.runtime.torch import TorchBackend

    if options.device == "cuda" and not torch.cuda.is_available():
        raise HotrodError("device 'cuda' asked for, but this torch has no CUDA device")
    dims = src.family.dims(src.config)
    contracts = graph_contracts(src.family.kind, dims)
    if options.uses_static_engine:
        from hotrod.runtime.static import EngineOptions, StaticBackend

        engine = EngineOptions(device=options.device, precision=options.precision)
        backend = StaticBackend(build_module(src), contracts, engine)
    else:
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


