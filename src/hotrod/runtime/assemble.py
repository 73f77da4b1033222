"""A HotrodModel put together on a backend: an artifact's ONNX graphs on onnxruntime, a checkpoint's weights on
torch (eager, or the static engine in a precision), or a static-engine artifact's stored weights. `hotrod.load`,
verification and the builds (a model over graphs being built) all assemble models here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from hotrod import artifact as art
from hotrod import precisions
from hotrod.build import static_engine
from hotrod.build.graphs import build_module
from hotrod.errors import HotrodError
from hotrod.kinds import spec as kind_spec
from hotrod.model import HotrodModel
from hotrod.models import get_family
from hotrod.optimize.portable import IN_PLACE_OP
from hotrod.options import ENGINE_PRECISIONS, check_choice
from hotrod.pipelines.sentence import SentencePipeline
from hotrod.runtime.base import RuntimeOptions
from hotrod.source import Source, load_generation_config, load_tokenizer, open_source, read_config, weights_sha256
from hotrod.verification.inputs import builtin_texts


def runtime_options(backend: str, device: str, threads: int, precision: str | None,
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


def load_artifact(artifact: art.Artifact, backend: str, device: str | None, threads: int,
                   profile: bool = False, options: RuntimeOptions | None = None) -> HotrodModel:
    """An onnxruntime artifact's graphs; on the torch backend, the checkpoint it was made from, run as
    `options` say (eager, or the static engine in its precision)."""
    device = device or artifact.manifest["options"].get("device", "cpu")
    if backend == "torch":
        options = replace(options or RuntimeOptions(backend=backend), device=device, threads=threads)
        return torch_model(artifact_source(artifact), options, load_tokenizer(artifact.path))
    check_built_for(artifact, device)
    return ort_model(artifact.path, artifact.manifest["graphs"], device, threads, artifact.manifest, profile)


def ort_model(directory: Path, entries: dict[str, dict], device: str, threads: int = 0,
               manifest: dict | None = None, profile: bool = False) -> HotrodModel:
    """The graphs `entries` names in `directory` on onnxruntime: an artifact's, or those of one being built,
    which has no manifest until the end."""
    from hotrod.runtime.ort import OrtBackend

    config = read_config(directory)
    family = get_family(config.model_type)
    contracts = kind_spec(family.kind_of(config)).contracts(family.dims(config))
    backend = OrtBackend(art.graph_files(directory, entries), contracts,
                         RuntimeOptions(backend="onnxruntime", device=device, threads=threads, profile=profile))
    return HotrodModel(family, config, backend, load_generation_config(directory, config), load_tokenizer(directory),
                       manifest=manifest, sentence=SentencePipeline.read(directory))


def check_built_for(artifact: art.Artifact, device: str) -> None:
    """A CPU build's in-place attention has no fp32 kernel on GPUs (`hotrod.optimize.portable`): refused,
    rather than left to run on the CPU behind the GPU's back."""
    graphs = artifact.manifest.get("graphs", {})
    in_place = [name for name, entry in graphs.items() if (entry.get("fused_ops") or {}).get(IN_PLACE_OP)]
    if device != "cpu" and in_place:
        raise HotrodError(f"{artifact.path} was built for the CPU: its {', '.join(in_place)} graph's in-place "
                          f"attention has no {device} kernel in fp32; rebuild it with `hotrod optimize --device {device}`")


def torch_model(src: Source, options: RuntimeOptions, tokenizer) -> HotrodModel:
    from hotrod.runtime.torch import TorchBackend

    if options.device == "cuda" and not torch.cuda.is_available():
        raise HotrodError("device 'cuda' asked for, but this torch has no CUDA device")
    dims = src.family.dims(src.config)
    contracts = kind_spec(src.family.kind_of(src.config)).contracts(dims)
    generation = load_generation_config(src.path, src.config)
    if options.uses_static_engine:
        from hotrod.runtime.static import EngineOptions, StaticBackend

        module, islands = build_module(src), ()
        if precisions.get(options.precision).measures_islands:  # on the fp32 model, on the device, as a build does
            fp32 = TorchBackend(module, contracts, replace(options, static=False, precision="fp32"))
            islands = tuple(static_engine.measure_islands(HotrodModel(src.family, src.config, fp32, generation, tokenizer),
                                                   builtin_texts()))
        options = EngineOptions(device=options.device, precision=options.precision, keep_fp32=islands)
        backend = StaticBackend(module, contracts, options)
    else:
        backend = TorchBackend(build_module(src), contracts, options)
    return HotrodModel(src.family, src.config, backend, generation, tokenizer, sentence=SentencePipeline.read(src.path))


def artifact_source(artifact: art.Artifact) -> Source:
    """The torch backend runs checkpoint weights; an artifact names its source and the weights' hash."""
    recorded = artifact.manifest["source"]
    path = Path(recorded["path"])
    if not path.is_dir() or weights_sha256(path) != recorded["weights_sha256"]:
        raise HotrodError(
            f"the torch backend needs the checkpoint this artifact was made from ({recorded['origin']}), "
            "which is no longer where it was or has changed; load the checkpoint itself with backend='torch'"
        )
    return open_source(path, artifact.manifest.get("task"))
