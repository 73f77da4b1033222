"""`hotrod optimize`: a checkpoint built into an artifact, by the onnxruntime build or the static engine's,
in one precision or the one `--precision auto` chooses, verified against the source; the manifest is
written once, at the end, and the directory put in place whole (`hotrod.artifact.staging`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hotrod import artifact as art
from hotrod import precisions
from hotrod.build import graphs, static_engine
from hotrod.build.onnx import OnnxBuild, has_device
from hotrod.errors import HotrodError
from hotrod.options import ExportOptions, OptimizeOptions
from hotrod.runtime.assemble import torch_model
from hotrod.runtime.base import RuntimeOptions
from hotrod.source import Source, load_tokenizer, open_source
from hotrod.verification.compare import compare, examples_for, measure_of
from hotrod.verification.examples import Example
from hotrod.verification.inputs import builtin_texts, read_texts


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
    (`hotrod.build.static_engine`): cast once to `precision` (fp16 keeping the modules it cannot hold in fp32, measured
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
        reference = torch_model(src, RuntimeOptions(backend="torch"), load_tokenizer(src.path)) if examples else None
        if options.backend == "torch":
            builder = static_engine.EngineBuild(src, options, tmp, texts, lambda: reference or torch_model(
                src, RuntimeOptions(backend="torch"), load_tokenizer(src.path)))
        else:
            builder = OnnxBuild(src, options, tmp, texts)
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
        raise HotrodError(f"cannot build {chosen.name} for cpu: {chosen.cpu_refusal()}")
    available = static_engine.has_device if torch_backend else has_device
    if options.auto and options.device != "cpu" and not available(options.device):
        raise HotrodError(f"--precision auto times every candidate on the device, and {options.device} "
                          "is not available here")


def _auto(builder: graphs.Builder, reference, examples) -> tuple[ExportOptions, dict, dict]:
    """Choose the precision, keep the winner's files in the staging directory, and describe the choice."""
    from hotrod.build import auto

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


def _verification(src: Source, builder: graphs.Builder, directory: Path, entries: dict, reference,
                  examples: list[Example], figures: dict | None) -> dict | None:
    """The manifest's verification section: what was built against the source (`figures` when "auto"
    has measured them already), on the device it was built for where this machine has it, else on the
    CPU (and the section says so)."""
    if not examples:
        return None
    device = builder.options.device
    runs_on = device if device == "cpu" or builder.has_device(device) else "cpu"
    figures = figures or compare(builder.model(directory, entries, runs_on), reference, examples)
    section = {"against": src.origin, "examples_from": examples_origin(builder.options.verify_texts), "device": runs_on}
    if runs_on != device:
        section["note"] = f"built for {device}, which this machine lacks: verified on the CPU"
    return {**section, **figures}


def _calibration_texts(calibration) -> list[str]:
    if calibration is None:
        return builtin_texts()
    if isinstance(calibration, (str, Path)):
        return read_texts(calibration)
    calibration = list(calibration)  # read twice below: a generator once
    odd = next((t for t in calibration if not isinstance(t, str)), None)
    if odd is not None:
        raise HotrodError(f"calibration texts must be strings, got {odd!r}")
    texts = [t.strip() for t in calibration if t.strip()]
    if not texts:
        raise HotrodError("calibration texts are empty")
    return texts


def examples_origin(texts) -> str:
    if texts is None:
        return "built-in texts"
    return str(texts) if isinstance(texts, (str, Path)) else "given examples"
