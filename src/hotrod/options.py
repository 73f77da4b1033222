"""Frozen option sets, one per stage, shared by the Python API and the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hotrod import precisions, tasks
from hotrod.errors import HotrodError, check_choice, check_number
from hotrod.export.onnx import OPSET

# The lists are the registry's (`hotrod.precisions`); named here for the CLI and the scripts.
PRECISIONS = precisions.names(lambda p: p.onnx)  # onnxruntime's graphs
ENGINE_PRECISIONS = precisions.names(lambda p: p.engine)  # the torch backend's static engine (`runtime.static`)
BUILT_PRECISIONS = precisions.names()  # what `hotrod optimize` builds for one backend or the other
CALIBRATION_METHODS = ("minmax", "percentile", "entropy")
AUTO = "auto"  # build every candidate precision, keep the fastest within the accuracy budget
BACKENDS = ("onnxruntime", "torch")
DEVICES = ("cpu", "cuda")

Texts = str | Path | Sequence[str] | None


@dataclass(frozen=True)
class ExportOptions:
    """How an artifact is built, as its manifest records it. `device` is the device it is built for and
    loads on by default; `backend` the one that runs it (onnxruntime's graphs, or the torch engine's
    weights, which have no opset, fusion or calibration)."""

    precision: str = "fp32"
    device: str = "cpu"
    opset: int = OPSET
    fusion: bool = True
    calibration_method: str = "minmax"  # for precisions that calibrate activation ranges (int8-static)
    backend: str = "onnxruntime"

    def __post_init__(self):
        precisions.get(self.precision)
        check_choice("device", self.device, DEVICES)
        check_choice("calibration method", self.calibration_method, CALIBRATION_METHODS)
        check_choice("backend", self.backend, BACKENDS)

    def to_dict(self) -> dict:
        if self.backend == "torch":
            return {"backend": self.backend, "precision": self.precision, "device": self.device}
        return asdict(self)


@dataclass(frozen=True)
class OptimizeOptions:
    """Everything `hotrod.optimize` is told besides the source and the output directory.

    `precision` is a name of `hotrod.precisions`, or "auto". `calibration` and `verify_texts` are a file,
    a list of texts (examples, for `verify_texts`) or None for the built-in sets; `verify_examples` is how
    many examples verify the result (0 skips it), and with "auto", `max_drop` is the largest drop in score
    below the source's a candidate may have.
    """

    precision: str = "fp32"
    backend: str = "onnxruntime"  # or "torch": the static engine's weights (`hotrod.build.static_engine`)
    device: str = "cpu"
    fusion: bool = True
    calibration: Texts = None
    calibration_method: str = "minmax"
    verify_texts: Texts = None
    verify_examples: int = 32
    max_drop: float = 0.01
    force: bool = False  # replace an existing output directory whole
    progress: bool = True
    task: str | None = None  # the head to build (`hotrod.tasks`); None: the one the checkpoint names

    def __post_init__(self):
        self.export()  # precision, device, calibration method, backend
        if self.backend == "torch":
            self._check_engine()
        elif not self.auto and not precisions.get(self.precision).onnx:
            raise HotrodError(f"{self.precision} is the torch engine's precision (onnxruntime has no such graphs); "
                              "build it with --backend torch")
        elif not self.auto and self.device not in precisions.get(self.precision).devices:
            raise HotrodError(f"{self.precision} is built for {', '.join(precisions.get(self.precision).devices)} "
                              f"only; on {self.device} choose among "
                              f"{', '.join(precisions.names(lambda p: p.onnx and self.device in p.devices))}")
        # "auto" judges its candidates by verification, so it needs at least one example.
        check_number("verify_examples" + (" with precision 'auto'" if self.auto else ""), self.verify_examples,
                     1 if self.auto else 0)
        if not isinstance(self.verify_examples, int):
            raise HotrodError(f"verify_examples must be a whole number, got {self.verify_examples!r}")
        check_number("max_drop", self.max_drop, 0, 1)
        if self.task is not None:
            check_choice("task", self.task, tasks.names())

    def _check_engine(self) -> None:
        """What the torch engine's build reads: no graphs to fuse, nothing calibrated but fp16's islands."""
        chosen = None if self.auto else precisions.get(self.precision)
        if chosen is not None and not chosen.engine:
            raise HotrodError(chosen.engine_refusal(self.device))
        if not self.fusion:
            raise HotrodError("--no-fusion is for onnxruntime's graphs; the torch engine has none to fuse")
        if self.calibration_method != "minmax":
            raise HotrodError("--calibration-method is int8-static's (onnxruntime); the torch engine calibrates "
                              "no activation ranges")
        if self.calibration is not None and not (self.auto or precisions.get(self.precision).measures_islands):
            islanded = "/".join(precisions.names(lambda p: p.measures_islands))
            raise HotrodError(f"--calibration texts are where the torch engine measures {islanded}'s fp32 islands; "
                              f"precision {self.precision} reads none")

    @classmethod
    def of(cls, options: OptimizeOptions | None = None, **changes) -> OptimizeOptions:
        """`options` (or the defaults) with `changes`: how keyword arguments become an options object."""
        if options is None:
            return cls(**changes)
        if not isinstance(options, cls):
            raise HotrodError(f"options must be an OptimizeOptions, got {type(options).__name__}")
        return replace(options, **changes) if changes else options

    @property
    def auto(self) -> bool:
        return self.precision == AUTO

    def export(self, precision: str | None = None) -> ExportOptions:
        """The manifest's options for an artifact in `precision` (this one's; fp32 stands in for "auto")."""
        chosen = precision or ("fp32" if self.auto else self.precision)
        return ExportOptions(precision=chosen, device=self.device, fusion=self.fusion,
                             calibration_method=self.calibration_method, backend=self.backend)
