"""The torch engine's artifact: the static engine's weights, cast once when built and read back by `load`.

`hotrod optimize --backend torch` writes, beside the configs and tokenizer every artifact carries, one
safetensors file of the lean module's state in the chosen precision (`hotrod.runtime.static.prepare`):
fp32, bf16 or fp16 tensors, or int8 / e4m3 linear weights with their per-channel scales. For fp16 the
modules that overflow it stay in fp32: they are measured once, on the fp32 model over the calibration
texts (`hotrod.runtime.cast.overflowing_modules`), and the manifest names them, so a load measures
nothing again: the module is rebuilt in the stored shape and the stored tensors go into it.

`EngineBuild` is what `hotrod.build.optimize` drives for the torch backend, as it drives `hotrod.build.onnx.OnnxBuild`
for onnxruntime's graphs: both write a precision into a directory, give a model over it (for
verification and `--precision auto`), keep the chosen one and describe it for the manifest.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hotrod import artifact as art
from hotrod import precisions
from hotrod.build import graphs
from hotrod.errors import HotrodError, first_line
from hotrod.files import inside
from hotrod.kinds import spec as kind_spec
from hotrod.model import HotrodModel
from hotrod.models import get_family
from hotrod.options import ExportOptions, OptimizeOptions
from hotrod.pipelines.sentence import SentencePipeline
from hotrod.registry import Family
from hotrod.runtime.base import cpu_threads
from hotrod.runtime.static import EngineOptions, StaticBackend, prepare
from hotrod.source import Source, load_generation_config, load_tokenizer, read_config

WEIGHTS = "engine.safetensors"
ISLAND_TEXTS = 16  # the calibration texts they are measured on, at most


def is_engine(manifest: dict) -> bool:
    """Whether an artifact's manifest is the torch engine's (older manifests name no backend: onnxruntime)."""
    return (manifest.get("options") or {}).get("backend") == "torch"


def measure_islands(model: HotrodModel, texts: Sequence[str]) -> list[str]:
    """The modules fp16 must leave in fp32: `model` (fp32, on the torch backend) run over up to
    ISLAND_TEXTS of `texts`, evenly spread, every module's inputs and outputs watched
    (`hotrod.runtime.cast.overflowing_modules`). Overflow is a property of the weights, seen on most
    inputs (T5's feed-forward blocks), so a sample finds it; every text would multiply a build's time."""
    from hotrod.optimize.calibration import run_texts, spread
    from hotrod.runtime.cast import overflowing_modules

    sample = spread(list(texts), ISLAND_TEXTS)
    return overflowing_modules(model.backend.module, lambda: run_texts(model, sample))


def has_device(device: str) -> bool:
    """Whether torch here runs on `device`; an artifact built for a GPU elsewhere is verified on the CPU."""
    return device == "cpu" or (device == "cuda" and torch.cuda.is_available())


class EngineBuild(graphs.Builder):
    """The torch engine's weights for `src`, in any engine precision, built in `base` (the staging directory).

    `fp32` gives the fp32 model the islands are measured on (the verification reference, where there is one).
    """

    def __init__(self, src: Source, options: OptimizeOptions, base: Path, texts: list[str],
                 fp32: Callable[[], HotrodModel]):
        self.src, self.options, self.base, self.texts = src, options, base, texts
        self.files = graphs.write_configs(src, base)
        self.described = graphs.describe_source(src)
        self._fp32 = fp32
        self._islands: list[str] | None = None

    def islands(self) -> list[str]:
        if self._islands is None:
            self._islands = measure_islands(self._fp32(), self.texts)
        return self._islands

    def apply(self, precision: str, directory: Path) -> dict:
        """Write `precision`'s weights in `directory`; returns the manifest's "engine" section."""
        islands = self.islands() if precisions.get(precision).measures_islands else []
        options = EngineOptions(device="cpu", precision=precision, keep_fp32=tuple(islands))
        write_weights(prepare(graphs.build_module(self.src), options), directory / WEIGHTS)
        return {"weights": WEIGHTS, "precision": precision, "islands": islands}

    def model(self, directory: Path, section: dict, device: str) -> HotrodModel:
        return engine_model(directory, section, device)

    def has_device(self, device: str) -> bool:
        return has_device(device)

    def keep(self, directory: Path, section: dict) -> None:
        """The weights in `directory` become the artifact's."""
        shutil.move(str(directory / section["weights"]), self.base / section["weights"])

    def manifest(self, export: ExportOptions, section: dict, **extra) -> dict:
        files = {**self.files, WEIGHTS: art.file_entry(self.base, WEIGHTS)}
        return graphs.manifest(self.described, export, {}, files, engine=section, **extra)


def write_weights(module: torch.nn.Module, file: Path) -> None:
    """The module's state as safetensors, each tensor stored once and whole (a tensor sharing memory with
    another one is copied: safetensors keeps no aliases)."""
    from safetensors.torch import save_file

    state, seen = {}, set()
    for name, value in module.state_dict().items():
        value = value.detach()
        where = value.untyped_storage().data_ptr()
        state[name] = value.clone() if where in seen else value.contiguous()
        seen.add(where)
    save_file(state, str(file), metadata={"format": "hotrod-engine"})


def read_weights(file: Path, family: Family, config, options: EngineOptions) -> torch.nn.Module:
    """The family's module in the stored shape (quantized layers, fp32 islands) holding the stored tensors."""
    from safetensors.torch import load_file

    module = prepare(family.build(config), options)
    try:
        state = load_file(str(file))
    except Exception as exc:  # noqa: BLE001  (any parse failure means a damaged file)
        raise HotrodError(f"cannot read the engine weights {file}: {first_line(exc)}") from None
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise HotrodError(f"{file} does not hold this model's {options.precision} weights: {first_line(exc)}") from None
    return module


def engine_model(directory: Path, section: dict, device: str, threads: int = 0,
                 manifest: dict | None = None) -> HotrodModel:
    """The static engine over the weights `section` (a manifest's "engine") names in `directory`."""
    try:
        options = EngineOptions(device=device, precision=section["precision"], keep_fp32=tuple(section["islands"]))
        file = inside(directory, section["weights"], f"the manifest of {directory}")
    except (KeyError, TypeError) as exc:
        raise HotrodError(f"{directory}'s engine section is incomplete: {exc}") from None
    refusal = precisions.get(options.precision).engine_refusal(device)
    if refusal:  # before reading any weights
        raise HotrodError(refusal)
    config = read_config(directory)
    family = get_family(config.model_type)
    contracts = kind_spec(family.kind_of(config)).contracts(family.dims(config))
    if device == "cpu" and threads:  # torch's thread count is process-wide: only when asked
        torch.set_num_threads(cpu_threads(threads))
    backend = StaticBackend(read_weights(file, family, config, options), contracts, options, prepared=True)
    return HotrodModel(family, config, backend, load_generation_config(directory, config), load_tokenizer(directory),
                       manifest=manifest, sentence=SentencePipeline.read(directory))


def load_artifact(artifact: art.Artifact, backend: str | None, device: str | None, threads: int,
                  precision: str | None, static: bool | None, profile: bool) -> HotrodModel:
    """An engine artifact on the static engine, in its precision with its islands, on `device` (the one it
    was built for when None); what it cannot honour is one line."""
    path, manifest = artifact.path, artifact.manifest
    section = manifest.get("engine")
    if not isinstance(section, dict):
        raise HotrodError(f"{path}/{art.MANIFEST} is unreadable or incomplete: a torch artifact with no engine section")
    if backend not in (None, "torch"):
        raise HotrodError(f"{path} holds the torch engine's weights, not ONNX graphs, so {backend} cannot run it; "
                          "load it with backend='torch' (or name no backend)")
    if profile:
        raise HotrodError(f"profile reads onnxruntime's profiler, and {path} is a torch engine artifact")
    if static is False:
        raise HotrodError(f"{path} holds weights for the static engine; to run eager PyTorch, load the checkpoint "
                          f"{manifest['source']['origin']} itself")
    built = section.get("precision")
    if precision not in (None, built):
        raise HotrodError(f"{path} holds {built} weights; for {precision}, build another with "
                          f"hotrod optimize --backend torch --precision {precision}")
    device = device or manifest["options"].get("device", "cpu")
    if not has_device(device):
        raise HotrodError(f"{path} was built for {device}, and this torch sees no {device} device; "
                          "load it with device='cpu' to run the engine eagerly")
    return engine_model(path, section, device, threads, manifest)
