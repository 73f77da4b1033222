"""hotrod.build: what the build steps do between graphs."""

from __future__ import annotations

from pathlib import Path

import hotrod
from hotrod.build import graphs


def test_garbage_is_collected_between_steps_only_for_large_graphs(tmp_path, monkeypatch):
    """A full collection costs more than a small model's whole build: it runs only past COLLECT_ABOVE."""
    collected = []
    monkeypatch.setattr(graphs.gc, "collect", lambda: collected.append(1))
    monkeypatch.setattr(graphs, "COLLECT_ABOVE", 1000)
    (tmp_path / "decoder.onnx").write_bytes(b"x" * 600)
    (tmp_path / "notes.txt").write_bytes(b"x" * 5000)  # not a graph: not counted
    graphs.release_graphs(tmp_path)
    assert collected == []
    (tmp_path / "decoder.onnx.data").write_bytes(b"x" * 600)
    graphs.release_graphs(tmp_path)
    assert collected == [1]


def test_the_code_fingerprint_reads_the_code_that_shapes_an_artifact():
    """Caches of builds (the bench's, the demo's) are keyed by it: a change to a family's module, the export,
    the passes, the contracts or the artifact's format must give another fingerprint."""
    package = Path(hotrod.__file__).resolve().parent
    names = {file.relative_to(package).as_posix() for file in graphs.shaping_files()}
    assert {"models/t5.py", "models/attention.py", "export/onnx.py", "optimize/quantize.py", "build/graphs.py",
            "contracts.py", "artifact.py"} <= names
    assert all(file.is_file() for file in graphs.shaping_files())
