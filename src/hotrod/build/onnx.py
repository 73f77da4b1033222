"""The onnxruntime build: the fp32 export of a checkpoint (`hotrod.build.graphs`), lowered to a precision in a
directory, the feeds the precisions need recorded once."""

from __future__ import annotations

import shutil
from pathlib import Path

from hotrod import precisions
from hotrod.build import graphs
from hotrod.errors import HotrodError
from hotrod.model import HotrodModel
from hotrod.optimize.calibration import Feeds, capture_feeds
from hotrod.options import ExportOptions, OptimizeOptions
from hotrod.runtime.assemble import ort_model
from hotrod.source import Source


def has_device(device: str) -> bool:
    """Whether onnxruntime here can run on `device`; an artifact built for another machine is verified on CPU."""
    from hotrod.runtime.ort import providers_for

    try:
        providers_for(device)
    except HotrodError:
        return False
    return True


class OnnxBuild(graphs.Builder):
    """The fp32 export of `src` in `base` (made here), lowered to a precision in some directory; the feeds
    precisions need are recorded once."""

    def __init__(self, src: Source, options: OptimizeOptions, base: Path, texts: list[str]):
        self.options, self.base, self.texts = options, base, texts
        self.entries = graphs.export_graphs(src, base, options.fusion, options.progress, options.device)
        self.files = graphs.write_configs(src, base)
        self.described = graphs.describe_source(src)
        self._feeds: Feeds | None = None

    def feeds(self) -> Feeds:
        if self._feeds is None:
            self._feeds = capture_feeds(ort_model(self.base, self.entries, "cpu"), self.texts)
        return self._feeds

    def apply(self, precision: str, directory: Path) -> dict:
        """Lower the graphs in `directory` (a copy of the fp32 export, or the export itself)."""
        chosen = precisions.get(precision)
        feeds = self.feeds() if chosen.needs_feeds else None
        entries = graphs.lower(directory, self.entries, chosen, feeds, self.options.calibration_method,
                              self.options.progress)
        if self.options.fusion and self.options.device == "cpu":
            entries = graphs.finish_for_cpu(directory, entries, chosen)
        return entries

    def model(self, directory: Path, entries: dict, device: str) -> HotrodModel:
        return ort_model(directory, entries, device)

    def has_device(self, device: str) -> bool:
        return has_device(device)

    def keep(self, directory: Path, entries: dict) -> None:
        """The graphs in `directory` replace the export's."""
        for name in {e["file"] for e in self.entries.values()} | {p.name for p in self.base.glob("*.onnx.data")}:
            (self.base / name).unlink(missing_ok=True)
        for file in directory.iterdir():
            if file.name.endswith(graphs.GRAPH_SUFFIXES):
                shutil.move(str(file), self.base / file.name)

    def manifest(self, export: ExportOptions, entries: dict, **extra) -> dict:
        return graphs.manifest(self.described, export, entries, self.files, **extra)
