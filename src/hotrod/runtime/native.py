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
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import helper

from hotrod.errors import HotrodError
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


# The kernels' interface (ops, attributes, entry points) this Python side speaks: native/i8gemm.h's
# HOTROD_KERNELS_VERSION, which a library built from other sources does not match.
KERNELS_VERSION = 8

TILES_ENV = "HOTROD_TILES"  # "off": hotrod's kernels run as on a CPU without AMX, for measuring that path here
_TILES_VALUES = {"on": True, "off": False, "": True}


def tiles_allowed() -> bool:
    """Whether graphs loaded now may put hotrod's kernels on AMX's tiles: yes, unless `TILES_ENV` says off or
    a caller left them out (`tiles_left_out`)."""
    return _allowed[-1] if _allowed else _tiles_env()


def _tiles_env() -> bool:
    value = os.environ.get(TILES_ENV, "on").strip().lower()
    if value not in _TILES_VALUES:
        raise HotrodError(f"{TILES_ENV} must be on or off, not {value!r}")
    return _TILES_VALUES[value]


_allowed: list[bool] = []  # tiles_left_out's, innermost last


@contextlib.contextmanager
def tiles_left_out() -> Iterator[None]:
    """Graphs loaded within the block take the path a CPU without AMX takes: the int8 and bf16 products on
    AVX-512 (each op is told its path as the graph is rewritten, and keeps it), the attention on AVX-512F.
    Sessions loaded before keep theirs. For testing and measuring that path on a CPU that has the tiles
    (onnxruntime's own kernels keep theirs: benchmarks/without_amx.sh takes them away from every library)."""
    _allowed.append(False)
    try:
        yield
    finally:
        _allowed.pop()


@functools.cache
def _handle() -> ctypes.CDLL | None:
    """The library as this process loaded it (onnxruntime's sessions load the same one); None where there is
    none, or where it was built from older sources than these (`make native` builds it again): hotrod's AMX and
    AVX-512 kernels are then left to onnxruntime."""
    path = library()
    if path is None:
        return None
    handle = ctypes.CDLL(str(path))
    version = getattr(handle, "hotrod_kernels_version", None)
    return handle if version is not None and version() == KERNELS_VERSION else None


def entry(symbol: str, restype: type, argtypes: list[type]) -> Callable[..., object] | None:
    """The library's function `symbol`, typed; None where there is no library of these sources here."""
    handle = _handle()
    if handle is None:
        return None
    function = getattr(handle, symbol)
    function.restype, function.argtypes = restype, argtypes
    return function


def tiles_ready(flags: tuple[str, ...]) -> bool:
    """Whether an AMX kernel needing `flags` runs on the tiles in graphs loaded now: the tiles granted for it
    (`_granted`) and allowed (`tiles_allowed`)."""
    return _granted(flags) and tiles_allowed()


@functools.cache
def _granted(flags: tuple[str, ...]) -> bool:
    """The flags in this CPU's, the library built, and the tile state granted (Linux grants it per process, on
    request; `hotrod_amx_ready` asks once)."""
    handle = _handle()
    return handle is not None and has_flags(flags) and bool(handle.hotrod_amx_ready())


def tiles_granted() -> bool:
    """Whether hotrod's kernels use AMX's tiles in graphs loaded now (`tiles_ready` for the tiles alone)."""
    return tiles_ready(("amx_tile",))


def tiles_state() -> str:
    """How this process stands with AMX's tiles, for naming what was measured in it: "tiles" (hotrod's kernels
    use them), "left out" (granted, but `tiles_allowed` says no: onnxruntime's kernels still use them) or
    "none" (no tiles here, or Linux did not grant them: no library uses them)."""
    if tiles_granted():
        return "tiles"
    return "left out" if _granted(("amx_tile",)) else "none"


@functools.cache
def vectors_ready(flags: tuple[str, ...], symbol: str) -> bool:
    """Whether a kernel's AVX-512 path, for a CPU without tiles, runs here: the `flags` in this CPU's, and the
    library built with the path (its `symbol` says so: a compiler that knew no AMX built neither)."""
    handle = _handle()
    if handle is None or not has_flags(flags):
        return False
    return bool(getattr(handle, symbol)())


def use_library(options: ort.SessionOptions) -> None:
    options.register_custom_ops_library(str(library()))


def add_domain(model: onnx.ModelProto) -> None:
    if not any(opset.domain == DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


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
