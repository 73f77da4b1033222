"""hotrod's CPU kernels as onnxruntime custom ops (`hotrod/native`, built by `make native`): the library,
where this CPU can load it, and graphs rewritten to use it.

An artifact's graphs keep onnxruntime's own ops, so it runs anywhere; as a graph is loaded on a CPU that has
the library, the nodes a kernel computes the same way are rewritten to its op, in a temporary file
(`hotrod.runtime.cpu_kernels` chooses which). The library's entry point needs AVX2 and FMA; each kernel
then names what more it needs (`hotrod.runtime.q4`: AVX-512 VNNI).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import platform
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import helper

from hotrod.optimize import graphs

DOMAIN = "hotrod"
LIBRARY = Path(__file__).resolve().parent.parent / "native" / "libhotrod_cpu.so"
_LOADS_WITH = ("avx2", "fma")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux reports them; none elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux
        return frozenset()
    return frozenset(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))


@functools.cache
def cpu_name() -> str:
    """This CPU's model as Linux reports it; elsewhere what the platform says."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux
        lines = []
    found = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return found or platform.processor() or platform.machine()


@functools.cache
def library() -> Path | None:
    """The built library, where this CPU can load it; None elsewhere (onnxruntime's own ops run)."""
    return LIBRARY if LIBRARY.is_file() and has_flags(_LOADS_WITH) else None


def has_flags(flags: tuple[str, ...]) -> bool:
    return all(flag in cpu_flags() for flag in flags)


@functools.cache
def tiles_ready(flags: tuple[str, ...]) -> bool:
    """Whether an AMX kernel needing `flags` runs here: the flags in this CPU's, the library built, and the
    tile state granted (Linux grants it per process, on request; `hotrod_amx_ready` asks once)."""
    path = library()
    if path is None or not has_flags(flags):
        return False
    return bool(ctypes.CDLL(str(path)).hotrod_amx_ready())


def use_library(options: ort.SessionOptions) -> None:
    options.register_custom_ops_library(str(library()))


def add_domain(model: onnx.ModelProto) -> None:
    if not any(opset.domain == DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def unused_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_1`, `name_2`, ...: the first not in `taken`, which it joins."""
    candidate, suffix = name, 1
    while candidate in taken:
        candidate, suffix = f"{name}_{suffix}", suffix + 1
    taken.add(candidate)
    return candidate


def swap_initializers(graph: onnx.GraphProto, replaced: set[str], added: list[onnx.TensorProto]) -> None:
    """`added` in; those of `replaced` that no node or graph output reads any more out. The rest are copied
    over: clearing the list frees the originals."""
    read = graphs.read_names(graph)
    kept = []
    for init in graph.initializer:
        if init.name not in replaced or init.name in read:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            kept.append(copy)
    del graph.initializer[:]
    graph.initializer.extend(kept + added)


def loadable(path: Path, words: tuple[bytes, ...]) -> onnx.ModelProto | None:
    """The graph at `path`, parsed, where it mentions one of `words` (an op's name) and keeps its weights
    inside; None otherwise, found without parsing a graph that mentions none."""
    if library() is None or not any(_mentions(path, word) for word in words):
        return None
    model = onnx.load(str(path))
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer):
        return None
    return model


@contextlib.contextmanager
def graph_file(model: onnx.ModelProto | None) -> Iterator[Path | None]:
    """`model` in a temporary file for the span of the block (onnxruntime reads a graph from a file lazily,
    where from bytes it would keep every initializer, an encoder-decoder's three token embeddings included,
    resident); None for None, or where there is no room to write it."""
    if model is None:
        yield None
        return
    # A file without a name in any folder, read through this process's descriptor: a process killed
    # meanwhile leaves nothing behind.
    handle = None
    try:
        handle = tempfile.TemporaryFile(suffix=".onnx")
        handle.write(model.SerializeToString())
        handle.flush()
    except OSError:  # no room for it: onnxruntime's own ops run the graph as it is
        if handle is not None:
            handle.close()
        yield None
        return
    del model
    with handle:
        yield Path(f"/proc/self/fd/{handle.fileno()}")


def _mentions(path: Path, word: bytes) -> bool:
    """Whether the file holds `word`, looked for in place: a graph without the op (an fp32 GPT-2's is
    500 MB) is neither read into memory nor parsed."""
    with path.open("rb") as file:
        if not os.fstat(file.fileno()).st_size:
            return False
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return view.find(word) >= 0
