"""The steps that build an artifact directory, in order: export + fuse, lower precision, describe.

`hotrod.build.optimize` strings them together (and `--precision auto` runs the last steps once per
candidate); each step works on a directory and returns the manifest entries it produced.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import onnx
import torch

from hotrod import artifact as art
from hotrod import precisions
from hotrod.export import export_graph
from hotrod.kinds import spec as kind_spec
from hotrod.optimize import cpu_attention_graph, fuse_graph, lower_graph, note_fp32_ops, portable_graph
from hotrod.optimize.calibration import Feeds
from hotrod.optimize.fusion import fused_op_counts, kernel_runs
from hotrod.options import ExportOptions, OptimizeOptions
from hotrod.pipelines.activation import SETTINGS as CROSS_ENCODER_SETTINGS
from hotrod.pipelines.activation import recorded_in_files
from hotrod.pipelines.sentence import SentencePipeline
from hotrod.precisions import Precision
from hotrod.source import Source, load_generation_config, load_state_dict, load_tokenizer, weights_sha256
from hotrod.tasks import TASK_KEY, labels

GRAPH_SUFFIXES = (".onnx", ".onnx.data")


def build_module(src: Source) -> torch.nn.Module:
    """The family's lean module with the checkpoint's weights, in eval mode."""
    module = src.family.build(src.config)
    module.load_hf(load_state_dict(src.path))
    return module.eval()


def export_graphs(src: Source, directory: Path, fusion: bool, progress: bool, device: str = "cpu") -> dict[str, dict]:
    """Export every graph of the model's kind (`Family.kind_of`) in fp32, fused unless `fusion` is off. Every
    graph is exported before any is fused, so the torch weights are gone before ONNX Runtime's optimizer
    (about five copies of a graph's weights at its peak) starts.

    Where ONNX Runtime has no fp32 kernel for in-place attention (a GPU, odd head sizes), it becomes ops
    that run everywhere (`hotrod.optimize.portable`).
    """
    dims = src.family.dims(src.config)
    kind = kind_spec(src.family.kind_of(src.config))
    contracts = kind.contracts(dims)
    module = build_module(src)
    graphs = module.graphs()
    externals = {name: export_graph(graphs[name], io, dims.vocab_size, directory / f"{name}.onnx")
                 for name, io in progress_bar(contracts.items(), progress, "export", len(contracts))}
    del module, graphs  # what follows reads the graphs from their files: the torch weights go first
    release_graphs(directory)
    entries = {}
    for name, io in progress_bar(contracts.items(), progress, "fuse", len(contracts)):
        path = directory / f"{name}.onnx"
        external = externals[name]
        # The exporter's own fused attention is there with or without the optimizer.
        report: dict = {"fused_ops": fused_op_counts(onnx.load(str(path), load_external_data=False))}
        if fusion and src.family.onnx_optimizer:
            steps = name == kind.step_graph
            external, report = fuse_graph(path, src.family.onnx_optimizer, dims, device, steps)
        if not kernel_runs(device, dims.head_dim):
            external, rewritten = portable_graph(path)
            report.update(rewritten)
        if src.family.fp32_ops:
            note_fp32_ops(path, src.family.fp32_ops)
        entries[name] = {
            **_files(directory, path, external),
            "inputs": [t.to_dict() for t in io.inputs],
            "outputs": [t.to_dict() for t in io.outputs],
            **report,
        }
        release_graphs(directory)
    return entries


# Graphs (bytes in the directory) past which a step's garbage is collected at once (`release_graphs`).
COLLECT_ABOVE = 256 * 2**20


def release_graphs(directory: Path) -> None:
    """Free the graphs a step has let go of. onnx-ir's graphs and ONNX Runtime's optimizer hold their
    ModelProtos in reference cycles, which only Python's cyclic collector frees, and it seldom runs when
    the garbage is a few large objects: 8 layers of BERT-large left 1 GB of it after the export, under
    int8-static's calibration and its three more copies of the graph. A full collection in a process that
    holds torch and transformers costs more than a small model's whole build, so it runs only where the
    graphs in `directory` are large enough for their garbage to matter."""
    size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file() and f.name.endswith(GRAPH_SUFFIXES))
    if size >= COLLECT_ABOVE:
        gc.collect()


def lower(directory: Path, entries: dict[str, dict], precision: Precision, feeds: Feeds | None, method: str,
          progress: bool) -> dict[str, dict]:
    """Apply `precision` to every graph in `directory`; returns the updated entries."""
    if not precision.converts:
        return entries
    lowered = {}
    for name, entry in progress_bar(entries.items(), progress, precision.name, len(entries)):
        path = directory / entry["file"]
        external, report = lower_graph(path, precision, (feeds or {}).get(name), method)
        lowered[name] = {**entry, **_files(directory, path, external), **report}
        release_graphs(directory)
    return lowered


def finish_for_cpu(directory: Path, entries: dict[str, dict], precision: Precision) -> dict[str, dict]:
    """The last rewrite of a fused CPU build, once its precision is applied: encoders' self-attention as
    ONNX's Attention (`hotrod.optimize.fusion.onnx_attention`), except in half precision."""
    if precision.compute == "half":
        return entries
    finished = {}
    for name, entry in entries.items():
        path = directory / entry["file"]
        rewritten = cpu_attention_graph(path)
        if rewritten is None:
            finished[name] = entry
            continue
        external, report = rewritten
        finished[name] = {**entry, **_files(directory, path, external), **report}
    return finished


def _files(directory: Path, path: Path, external: Path | None) -> dict:
    return {**art.file_entry(directory, path.name),
            "external_data": art.file_entry(directory, external.name) if external else None}


def copy_graphs(source: Path, dest: Path) -> None:
    """Copy an artifact directory's files (graphs and configs; the manifest is written afresh)."""
    dest.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.name != art.MANIFEST:
            shutil.copyfile(file, dest / file.name)
    pipeline = SentencePipeline.read(source)  # its module folders' files (`write_configs`), and nothing else:
    for name in pipeline.files if pipeline else ():  # `--precision auto`'s working folders live in `source` too
        if "/" in name:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, dest / name)


def write_configs(src: Source, out: Path) -> dict:
    """Copy config.json, write generation_config.json and the tokenizer, and copy a sentence-transformers
    checkpoint's module files (`hotrod.pipelines.sentence`: the artifact embeds as the checkpoint does);
    returns their manifest entries."""
    shutil.copyfile(src.path / "config.json", out / "config.json")
    told = getattr(src.config, TASK_KEY, None)
    if told:  # the task given with --task, kept with the config so that the artifact reads back as built
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, TASK_KEY: told}, indent=2) + "\n")
    load_generation_config(src.path, src.config).save_pretrained(out)
    tokenizer = load_tokenizer(src.path)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    pipeline = SentencePipeline.read(src.path)
    for name in pipeline.files if pipeline else ():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.path / name, out / name)
    if pipeline is None and recorded_in_files(src.path) is not None:  # a CrossEncoder's activation travels too
        shutil.copyfile(src.path / CROSS_ENCODER_SETTINGS, out / CROSS_ENCODER_SETTINGS)
    names = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.endswith(GRAPH_SUFFIXES))
    names += [name for name in (pipeline.files if pipeline else ()) if name not in names]
    return {name: art.file_entry(out, name) for name in names if name != art.MANIFEST}


def describe_source(src: Source) -> dict:
    """What every manifest of a build says about its source and makers; computed once per build, since
    hashing the weights reads the whole checkpoint."""
    return {
        "source": {"origin": src.origin, "path": str(src.path.resolve()), "from_hub": src.from_hub,
                   "weights_sha256": weights_sha256(src.path)},
        "family": src.family.name,
        "model_type": src.config.model_type,
        "kind": src.family.kind_of(src.config),
        "task": src.family.dims(src.config).task,
        "labels": {str(i): name for i, name in labels(src.config, src.family.dims(src.config).task).items()},
        "dims": src.family.dims(src.config).to_dict(),
        "versions": versions(),
        "code": code_fingerprint(),
        **({"sentence_transformers": pipeline.to_dict()} if (pipeline := SentencePipeline.read(src.path)) else {}),
    }


def manifest(described: dict, options: ExportOptions, entries: dict[str, dict], files: dict, **extra) -> dict:
    """Everything the artifact records about itself; `extra` adds sections (verification, auto, engine, ...)."""
    precision = precisions.get(options.precision)
    return {
        **described,
        "options": options.to_dict(),
        "weights": precision.describe_engine() if options.backend == "torch" else precision.describe(options.calibration_method),
        "graphs": entries,
        "files": files,
        **extra,
    }


class Builder:
    """What `hotrod.build.optimize` drives to build an artifact in `base` (its staging directory), with or
    without `--precision auto`: onnxruntime's graphs (`hotrod.build.onnx.OnnxBuild`) or the torch engine's weights
    (`hotrod.build.static_engine.EngineBuild`). Each writes a precision into a directory and returns its manifest
    entries (`apply`), gives a model over them (`model`: verification, auto's timing), keeps a
    candidate's files as the artifact's (`keep`) and writes its manifest (`manifest`)."""

    options: OptimizeOptions
    base: Path

    def apply(self, precision: str, directory: Path) -> dict:
        raise NotImplementedError

    def model(self, directory: Path, entries: dict, device: str):
        raise NotImplementedError

    def has_device(self, device: str) -> bool:
        """Whether this machine runs what is built on `device` (else it is verified on the CPU)."""
        raise NotImplementedError

    def keep(self, directory: Path, entries: dict) -> None:
        raise NotImplementedError

    def manifest(self, options: ExportOptions, entries: dict, **extra) -> dict:
        raise NotImplementedError

    def copy(self, precision: str, directory: Path) -> tuple[Path, dict]:
        """The base's files copied to `directory` and `precision` applied there (a candidate of auto)."""
        copy_graphs(self.base, directory)
        return directory, self.apply(precision, directory)

    def candidates(self) -> list[str]:
        """`--precision auto`'s candidates for the device and backend built for."""
        from hotrod.build import auto

        return auto.candidates(self.options.device, self.options.backend)


def code_fingerprint() -> str:
    """A hash of the code that shapes an artifact (models, export, passes, the build, the graphs' contracts and
    the artifact's format), so caches know a stale build."""
    import hashlib

    digest = hashlib.sha256()
    for file in shaping_files():
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def shaping_files() -> list[Path]:
    """The package's files `code_fingerprint` reads."""
    package = Path(__file__).resolve().parent.parent
    files = [file for folder in _SHAPING_FOLDERS for file in sorted((package / folder).glob("*.py"))]
    return files + [package / name for name in _SHAPING_FILES]


_SHAPING_FOLDERS = ("models", "export", "optimize", "build")
_SHAPING_FILES = ("contracts.py", "artifact.py", "precisions.py", "registry.py")


def versions() -> dict:
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


def progress_bar(items: Iterable, enabled: bool, desc: str, total: int, unit: str = "graph") -> Iterable:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, unit=unit, file=sys.stderr)
