"""The Python API: `optimize` writes an artifact, `load` returns a drop-in model.

The CLI is a thin layer over these two functions.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from hotrod import artifact as art
from hotrod import build, engine, precisions
from hotrod.build import build_module
from hotrod.errors import HotrodError
from hotrod.kinds import spec as kind_spec
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
from hotrod.models import get_family
from hotrod.optimize.calibration import Feeds, capture_feeds
from hotrod.optimize.portable import IN_PLACE_OP
from hotrod.options import BACKENDS, DEVICES, ENGINE_PRECISIONS, ExportOptions, OptimizeOptions, check_choice
from hotrod.runtime.base import RuntimeOptions
from hotrod.verification.examples import Example
from hotrod.verification.inputs import builtin_texts, read_texts
from hotrod.verify import DEFAULT_EXAMPLES, compare, examples_for, measure, measure_of


def optimize(source: str | Path, out: str | Path, options: OptimizeOptions | None = None, **changes) -> Path:
    """Export `source` (a checkpoint directory or hub id) to an artifact directory `out`; returns its path.

    `options` (`hotrod.options.OptimizeOptions`; the defaults when None) says how, and keyword arguments
    named after its fields change it: `hotrod.optimize(src, out, precision="int8")`. Every graph is exported and
    fused (unless `fusion=False`), then lowered to `precision` (`hotrod.precisions`, or "auto"). Precisions
    that need feeds record them from the fp32 model on `calibration` texts (a file, a list, or the
    built-in set). The result is verified against the source on `verify_examples` examples (0 skips it)
    and the manifest, written once at the end, holds the figures. With "auto", every candidate is built,
    verified and timed, and the fastest whose score drops at most `max_drop` below the source's is kept;
    the manifest's "auto" section holds the whole table.

    With `backend="torch"` the artifact holds the static engine's weights instead of graphs
    (`hotrod.engine`): cast once to `precision` (fp16 keeping the modules it cannot hold in fp32, measured
    on the calibration texts), verified and, with "auto", chosen the same way.
    """
    options = OptimizeOptions.of(options, **changes)
    _check_machine(options)
    texts = _calibration_texts(options.calibration)  # a bad file fails before any work
    out = Path(out)
    src = open_source(source, options.task)
    examples = examples_for(options.verify_texts, *measure_of(src.family, src.config))[:options.verify_examples]
    if out.resolve() == src.path.resolve() or out.resolve() in src.path.resolve().parents:
        raise HotrodError(f"--out {out} would replace the source checkpoint {src.path}; choose another directory")
    with art.staging(out, options.force) as tmp:
        reference = _torch_model(src, RuntimeOptions(backend="torch"), load_tokenizer(src.path)) if examples else None
        if options.backend == "torch":
            builder = engine.EngineBuild(src, options, tmp, texts, lambda: reference or _torch_model(
                src, RuntimeOptions(backend="torch"), load_tokenizer(src.path)))
        else:
            builder = _Lowering(src, options, tmp, texts)
        if options.auto:
            export, entries, extra = _auto(builder, reference, examples)
        else:
            export, entries, extra = options.export(), builder.apply(options.precision, tmp), {}
        figures = extra.pop("figures", None)
        extra["verification"] = _verification(src, builder, tmp, entries, reference, examples, figures)
        art.write_manifest(tmp, builder.manifest(export, entries, **extra))
    return out


def _check_machine(options: OptimizeOptions) -> None:
    """What the options cannot check alone: this machine's kernels and devices."""
    chosen = None if options.auto else precisions.get(options.precision)
    torch_backend = options.backend == "torch"
    refusal = chosen.engine_refusal(options.device) if chosen is not None and torch_backend else None
    if refusal:
        raise HotrodError(f"cannot build {chosen.name} for {options.device}: {refusal}")
    if chosen is not None and not torch_backend and options.device == "cpu" and not chosen.has_kernels("cpu"):
        raise HotrodError(f"onnxruntime's CPU provider has no {chosen.name} kernels, so {chosen.name} "
                          "on cpu would only be slower; build it with --device cuda, or choose int8/int4 for CPU")
    available = engine.has_device if torch_backend else _has_device
    if options.auto and options.device != "cpu" and not available(options.device):
        raise HotrodError(f"--precision auto times every candidate on the device, and {options.device} "
                          "is not available here")


def _has_device(device: str) -> bool:
    """Whether onnxruntime here can run on `device`; an artifact built for another machine is verified on CPU."""
    from hotrod.runtime.ort import providers_for

    try:
        providers_for(device)
    except HotrodError:
        return False
    return True


class _Lowering(build.Builder):
    """The fp32 export of `src` in `base` (made here), lowered to a precision in some directory; the feeds
    precisions need are recorded once."""

    def __init__(self, src: Source, options: OptimizeOptions, base: Path, texts: list[str]):
        self.options, self.base, self.texts = options, base, texts
        self.entries = build.export_graphs(src, base, options.fusion, options.progress, options.device)
        self.files = build.write_configs(src, base)
        self.described = build.describe_source(src)
        self._feeds: Feeds | None = None

    def feeds(self) -> Feeds:
        if self._feeds is None:
            self._feeds = capture_feeds(_ort_model(self.base, self.entries, "cpu"), self.texts)
        return self._feeds

    def apply(self, precision: str, directory: Path) -> dict:
        """Lower the graphs in `directory` (a copy of the fp32 export, or the export itself)."""
        chosen = precisions.get(precision)
        feeds = self.feeds() if chosen.needs_feeds else None
        entries = build.lower(directory, self.entries, chosen, feeds, self.options.calibration_method,
                              self.options.progress)
        if self.options.fusion and self.options.device == "cpu":
            entries = build.finish_for_cpu(directory, entries, chosen)
        return entries

    def model(self, directory: Path, entries: dict, device: str) -> HotrodModel:
        return _ort_model(directory, entries, device)

    def has_device(self, device: str) -> bool:
        return _has_device(device)

    def keep(self, directory: Path, entries: dict) -> None:
        """The graphs in `directory` replace the export's."""
        for name in {e["file"] for e in self.entries.values()} | {p.name for p in self.base.glob("*.onnx.data")}:
            (self.base / name).unlink(missing_ok=True)
        for file in directory.iterdir():
            if file.name.endswith(build.GRAPH_SUFFIXES):
                shutil.move(str(file), self.base / file.name)

    def manifest(self, export: ExportOptions, entries: dict, **extra) -> dict:
        return build.manifest(self.described, export, entries, self.files, **extra)


def _auto(builder: build.Builder, reference, examples) -> tuple[ExportOptions, dict, dict]:
    """Choose the precision, keep the winner's files in the staging directory, and describe the choice."""
    from hotrod import auto

    options = builder.options
    workdir = Path(tempfile.mkdtemp(prefix=".auto.", dir=builder.base))
    built: dict[str, tuple[Path, dict]] = {}

    def build_one(precision: str, directory: Path) -> str:
        built[precision] = builder.copy(precision, directory)
        return precision

    try:
        winner, table = auto.choose(build_one, lambda p: builder.model(*built[p], options.device), reference, examples,
                                    builder.candidates(), options.max_drop, workdir, options.progress)
        chosen, entries = built[winner.precision]
        builder.keep(chosen, entries)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = {"max_drop": options.max_drop, "chosen": winner.precision,
               "score": (winner.figures or {}).get("score_name"), "candidates": [c.row() for c in table]}
    return options.export(winner.precision), entries, {"auto": section, "figures": winner.figures}


def _verification(src: Source, builder: build.Builder, directory: Path, entries: dict, reference,
                  examples: list[Example], figures: dict | None) -> dict | None:
    """The manifest's verification section: what was built against the source (`figures` when "auto"
    has measured them already), on the device it was built for where this machine has it, else on the
    CPU (and the section says so)."""
    if not examples:
        return None
    device = builder.options.device
    runs_on = device if device == "cpu" or builder.has_device(device) else "cpu"
    figures = figures or compare(builder.model(directory, entries, runs_on), reference, examples)
    section = {"against": src.origin, "examples_from": _origin(builder.options.verify_texts), "device": runs_on}
    if runs_on != device:
        section["note"] = f"built for {device}, which this machine lacks: verified on the CPU"
    return {**section, **figures}


def _calibration_texts(calibration) -> list[str]:
    if calibration is None:
        return builtin_texts()
    if isinstance(calibration, (str, Path)):
        return read_texts(calibration)
    texts = [t.strip() for t in calibration if isinstance(t, str) and t.strip()]
    if not texts:
        raise HotrodError("calibration texts are empty")
    return texts


def _origin(texts) -> str:
    if texts is None:
        return "built-in texts"
    return str(texts) if isinstance(texts, (str, Path)) else "given examples"


def load(
    path_or_source: str | Path,
    backend: str | None = None,
    device: str | None = None,
    threads: int = 0,
    precision: str | None = None,
    static: bool | None = None,
    profile: bool = False,
    task: str | None = None,
) -> HotrodModel:
    """A drop-in model from an artifact, or from a checkpoint (exported on first use for onnxruntime).

    A checkpoint runs the head its `architectures` names, or `task` (`hotrod.tasks`); an artifact runs the
    task it was built for. `backend` is the artifact's when None (onnxruntime for a checkpoint).
    On the torch backend a GPU runs the static engine (`hotrod.runtime.static`), in `precision` (fp32,
    bf16, fp16, int8-weight, fp8; fp32 when not given); `static=True` runs it on a CPU too. A torch engine
    artifact (`hotrod optimize --backend torch`) runs it from its stored weights, in the precision and
    with the fp32 islands it was built with, on the device it was built for unless `device` says
    otherwise. `profile` has onnxruntime time every node (`hotrod.bench.ops.op_times` reads it; runs are
    slower meanwhile).
    """
    if backend is not None:
        check_choice("backend", backend, BACKENDS)
    if device is not None:
        check_choice("device", device, DEVICES)
    if art.is_artifact(path_or_source):
        artifact = art.open_artifact(path_or_source)
        if task is not None and task != artifact.manifest.get("task"):
            raise HotrodError(f"{path_or_source} was built for {artifact.manifest.get('task')}, not {task}; "
                              f"build it with hotrod optimize --task {task}")
        if engine.is_engine(artifact.manifest):
            return engine.load_artifact(artifact, backend, device, threads, precision, static, profile)
    backend = backend or "onnxruntime"
    options = _runtime_options(backend, device or "cpu", threads, precision, static, profile)
    if art.is_artifact(path_or_source):
        return _load_artifact(artifact, backend, device, threads, profile, options)
    src = open_source(path_or_source, task)
    if backend == "torch":
        return _torch_model(src, options, load_tokenizer(src.path))
    built_for = options.device  # graphs differ by device (`hotrod.optimize.portable`)
    told = f"-{task}" if task else ""
    cached = cache_dir() / f"{src.family.name}-{source_fingerprint(src.path)[:20]}{told}-fp32"
    if built_for != "cpu":
        cached = cached.with_name(f"{cached.name}-{built_for}")
    try:
        artifact = art.open_artifact(cached)
    except HotrodError:  # not exported yet, or by an older hotrod, or damaged: export afresh
        optimize(src.origin if src.from_hub else src.path, cached, force=True, progress=sys.stderr.isatty(),
                 verify_examples=0, device=built_for, task=task)  # a cache for load(); `hotrod verify` measures it on request
        artifact = art.open_artifact(cached)
    return _load_artifact(artifact, backend, device, threads, profile)


def _runtime_options(backend: str, device: str, threads: int, precision: str | None,
                     static: bool | None, profile: bool = False) -> RuntimeOptions:
    options = RuntimeOptions(backend=backend, device=device, threads=threads, precision=precision or "fp32",
                             static=static, profile=profile)
    if precision is None:
        return options
    if backend != "torch":
        raise HotrodError("precision applies to the torch backend; an onnxruntime artifact's precision is chosen "
                          "when it is built (hotrod optimize --precision)")
    check_choice("torch precision", precision, ENGINE_PRECISIONS)
    if precisions.get(precision).converts and not options.uses_static_engine:
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

    See `hotrod.verify` for what is measured. `texts` is a file of examples in the task's format
    (`hotrod.verification.examples`), a list, or None for the built-in ones; the first `examples` are used.
    """
    if examples < 1:
        raise HotrodError(f"examples must be >= 1, got {examples}")
    if not art.is_artifact(path):
        raise HotrodError(f"{path} is not a hotrod artifact (no manifest.json); verify checks an artifact")
    artifact = art.open_artifact(path)
    if engine.is_engine(artifact.manifest):  # on the device it was built for where this machine has it
        built_for = artifact.manifest["options"].get("device", "cpu")
        device = built_for if engine.has_device(built_for) else "cpu"
        model = engine.load_artifact(artifact, None, device, threads, None, None, False)
    else:
        model = _load_artifact(artifact, "onnxruntime", None, threads)
    chosen = examples_for(texts, measure(model), list(model.labels.values()))[:examples]
    src = _artifact_source(artifact) if against is None else open_source(against, artifact.manifest.get("task"))
    if src.family.dims(src.config) != model.dims:
        raise HotrodError(f"{src.origin} is not the model of {path} (its dimensions differ)")
    reference = _torch_model(src, RuntimeOptions(backend="torch", threads=threads), model.tokenizer)
    figures = compare(model, reference, chosen, max_new_tokens=max_new_tokens)
    return {"against": src.origin, "examples_from": _origin(texts), **figures}


def _load_artifact(artifact: art.Artifact, backend: str, device: str | None, threads: int,
                   profile: bool = False, options: RuntimeOptions | None = None) -> HotrodModel:
    """An onnxruntime artifact's graphs; on the torch backend, the checkpoint it was made from, run as
    `options` say (eager, or the static engine in its precision)."""
    device = device or artifact.manifest["options"].get("device", "cpu")
    if backend == "torch":
        options = replace(options or RuntimeOptions(backend=backend), device=device, threads=threads)
        return _torch_model(_artifact_source(artifact), options, load_tokenizer(artifact.path))
    _check_built_for(artifact, device)
    return _ort_model(artifact.path, artifact.manifest["graphs"], device, threads, artifact.manifest, profile)


def _ort_model(directory: Path, entries: dict[str, dict], device: str, threads: int = 0,
               manifest: dict | None = None, profile: bool = False) -> HotrodModel:
    """The graphs `entries` names in `directory` on onnxruntime: an artifact's, or those of one being built,
    which has no manifest until the end."""
    from hotrod.runtime.ort import OrtBackend

    config = read_config(directory)
    family = get_family(config.model_type)
    contracts = kind_spec(family.kind).contracts(family.dims(config))
    backend = OrtBackend(art.graph_files(directory, entries), contracts,
                         RuntimeOptions(backend="onnxruntime", device=device, threads=threads, profile=profile))
    return HotrodModel(family, config, backend, load_generation_config(directory, config), load_tokenizer(directory),
                       manifest=manifest)


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
    contracts = kind_spec(src.family.kind).contracts(dims)
    generation = load_generation_config(src.path, src.config)
    if options.uses_static_engine:
        from hotrod.runtime.static import EngineOptions, StaticBackend

        module, islands = build_module(src), ()
        if precisions.get(options.precision).measures_islands:  # on the fp32 model, on the device, as a build does
            fp32 = TorchBackend(module, contracts, replace(options, static=False, precision="fp32"))
            islands = tuple(engine.measure_islands(HotrodModel(src.family, src.config, fp32, generation, tokenizer),
                                                   builtin_texts()))
        options = EngineOptions(device=options.device, precision=options.precision, keep_fp32=islands)
        backend = StaticBackend(module, contracts, options)
    else:
        backend = TorchBackend(build_module(src), contracts, options)
    return HotrodModel(src.family, src.config, backend, generation, tokenizer)


def _artifact_source(artifact: art.Artifact) -> Source:
    """The torch backend runs checkpoint weights; an artifact names its source and the weights' hash."""
    recorded = artifact.manifest["source"]
    path = Path(recorded["path"])
    if not path.is_dir() or weights_sha256(path) != recorded["weights_sha256"]:
        raise HotrodError(
            f"the torch backend needs the checkpoint this artifact was made from ({recorded['origin']}), "
            "which is no longer where it was or has changed; load the checkpoint itself with backend='torch'"
        )
    return open_source(path, artifact.manifest.get("task"))


