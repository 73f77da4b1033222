"""Which of hotrod's CPU kernels this machine runs, where a measurement chose (`hotrod tune`).

Each kernel is measured against onnxruntime's own ops on the CPUs the project meets, but not every CPU is one of
them, and a kernel that wins on one may lose on another (the int4 kernel lost on AMD's Zen 4 and Zen 5 until
its weights were read in the order they lie). `hotrod tune` times an artifact's work with every kernel and
without each, in turn, on this machine; a kernel whose absence was faster is recorded here as left out, and
graphs loaded afterwards keep onnxruntime's ops where it would have run. The record is this machine's: named by the CPU's
model and flags and by the kernels' library, so another CPU, or a rebuilt library, starts with every kernel.

A kernel's verdict can turn on the shapes (on a Zen 4 the int4 kernel once lost on GPT-2's products and won on
t5-small's), so the record also keeps each tuned artifact's own verdicts, by its manifest: an artifact that was
tuned runs what its own measurements chose, and the machine's choice where they chose nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hotrod.errors import HotrodError
from hotrod.files import file_sha256, write_whole
from hotrod.runtime import attention, bf16, i8, native, norm, q4, rows
from hotrod.source import cache_dir


@dataclass(frozen=True)
class Kernel:
    name: str  # as `hotrod tune` and its record name it
    ops: tuple[str, ...]  # hotrod's ops it brings into a graph (or an op's path, as a graph's kernels name it)


INT4, INT8, ROWS, LAYERNORM, ATTENTION = "int4-matmul", "int8-matmul", "quantize-rows", "layernorm", "attention"
BF16, ATTENTION_PAIRS = "bf16-matmul", "attention-pairs"
KERNELS = {kernel.name: kernel for kernel in (
    Kernel(INT4, (q4.OP,)),  # int4 products, onnxruntime's MatMulNBits
    Kernel(INT8, (i8.OP, i8.SPLIT_OP, i8.ROWS_OP, i8.QUANTIZED_OP)),  # int8 products on AMX tiles
    Kernel(ROWS, (rows.OP,)),  # per-row int8 quantization of a product's input
    Kernel(LAYERNORM, norm.OPS),  # LayerNormalization, with the next quantization
    Kernel(ATTENTION, (attention.OP, attention.QUANTIZED_OP)),  # encoder attention in bf16 on AMX tiles
    Kernel(BF16, bf16.OPS),  # bf16 products on AMX tiles, where the build asked for them
    Kernel(ATTENTION_PAIRS, (attention.PAIRS_PATH,)),  # that attention on VDPBF16PS without tiles, not on FMAs
)}

_override: frozenset[str] | None = None  # kernels left out for a measurement, whatever the record says


def kernels_in(ops: frozenset[str] | set[str]) -> list[str]:
    """The kernels whose ops a loaded graph holds, in the registry's order."""
    return [kernel.name for kernel in KERNELS.values() if set(kernel.ops) & set(ops)]


def record_path() -> Path:
    """This machine's record: named by the CPU's model and flags, by the built library's contents and by whether
    the kernels use AMX's tiles in this process (`native.tiles_state`: where Linux does not grant them, every
    library takes another path; where `native.TILES_ENV` leaves them out, hotrod's kernels alone do: each is
    measured apart)."""
    return cache_dir() / "kernels" / f"{_machine(native.tiles_state())}.json"


@functools.cache
def _machine(tiles: str) -> str:
    library = native.library()
    digest = hashlib.sha256(native.cpu_name().encode())
    digest.update(" ".join(sorted(native.cpu_flags())).encode())
    digest.update(file_sha256(library).encode() if library else b"no library")
    if tiles != "tiles":
        digest.update(f"tiles: {tiles}".encode())
    return digest.hexdigest()[:16]


def left_out(artifact: str | None = None) -> frozenset[str]:
    """The kernels this machine leaves out as graphs load: those `hotrod tune` measured slower here, for the
    artifact keyed `artifact` (`artifact_key`) by its own measurements where it has them."""
    if _override is not None:
        return _override
    machine, own = _current()
    return _combined(machine, dict(own.get(artifact, ())) if artifact is not None else {})


def tuned_artifacts() -> int:
    """How many artifacts the record keeps verdicts of their own for."""
    return sum(1 for verdicts in _current()[1].values() if verdicts)


def _combined(machine: frozenset[str] | set[str], verdicts: dict[str, bool]) -> frozenset[str]:
    """The kernels left out for an artifact: its own verdicts, the machine's choice for the kernels they miss."""
    return frozenset({name for name in machine if verdicts.get(name, True)} |
                     {name for name, out in verdicts.items() if out})


def _current() -> tuple[frozenset[str], dict[str, tuple]]:
    """The record as it is now (`_recorded`); nothing left out where there is none."""
    path = record_path()
    try:
        status = path.stat()
    except OSError:  # no record: every kernel runs
        return frozenset(), {}
    return _recorded(path, (status.st_ino, status.st_mtime_ns, status.st_size))


def _verdicts(verdicts: object) -> bool:
    """Whether `verdicts` is an artifact's entry in the record: hotrod's kernels by name, each left out or not."""
    return (isinstance(verdicts, dict) and set(verdicts) <= set(KERNELS)
            and all(isinstance(out, bool) for out in verdicts.values()))


def artifact_key(directory: Path) -> str | None:
    """The key of the artifact in `directory` in the record (its manifest's hash, so a rebuild is a new artifact
    to tune), or None for graphs that are no artifact's (a build under way)."""
    try:  # an unreadable manifest must not stop a model loading: the machine's choice then
        return file_sha256(directory / "manifest.json")[:16]
    except OSError:
        return None


@functools.cache
def _recorded(path: Path, stamp: tuple[int, int, int]) -> tuple[frozenset[str], dict[str, tuple]]:
    """The record at `path` as it was at `stamp` (its inode, modification time and size; each write is a new
    file put in place), read once, again when it changes: the machine's kernels left out, and each tuned
    artifact's verdicts ((kernel, left out), ...)."""
    try:
        body = json.loads(path.read_text())
        names, own = body["left_out"], body.get("by_artifact", {})
        if not isinstance(names, list) or not all(isinstance(name, str) and name in KERNELS for name in names):
            raise ValueError("left_out must list kernels by name")
        if not isinstance(own, dict) or not all(_verdicts(v) for v in own.values()):
            raise ValueError("by_artifact must map artifacts to kernels' verdicts")
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged record must not stop a model loading
        warnings.warn(f"hotrod: {path} is not a kernel record ({exc}); every kernel runs", stacklevel=2)
        return frozenset(), {}
    return frozenset(names), {key: tuple(verdicts.items()) for key, verdicts in own.items()}


@contextlib.contextmanager
def leaving_out(names: set[str] | frozenset[str]) -> Iterator[None]:
    """Graphs loaded within the block leave out `names` (and only those), whatever the record says."""
    global _override
    unknown = set(names) - set(KERNELS)
    if unknown:
        raise HotrodError(f"unknown kernels {sorted(unknown)}; hotrod's are {', '.join(KERNELS)}")
    before, _override = _override, frozenset(names)
    try:
        yield
    finally:
        _override = before


def record(decided: dict[str, bool], measured: dict[str, dict], artifact: str | None = None) -> tuple[Path, frozenset[str]]:
    """Writes this machine's record: each kernel in `decided` left out or not as it says, every other keeping
    its earlier choice, with the measurements that chose them (by kernel, beside earlier ones); the same verdicts
    as the artifact keyed `artifact`'s own. Two tunes at once take turns (a lock beside the record), so neither
    drops the other's choices. Returns the record and the kernels it now leaves out for that artifact."""
    unknown = set(decided) - set(KERNELS)
    if unknown:
        raise HotrodError(f"unknown kernels {sorted(unknown)}; hotrod's are {', '.join(KERNELS)}")
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = _read(path)
        kept = {name for name in before.get("left_out", []) if name in KERNELS and name not in decided}
        chosen = frozenset(kept | {name for name, out in decided.items() if out})
        earlier = before.get("measured", {})
        earlier_own = before.get("by_artifact")
        own = {key: verdicts for key, verdicts in earlier_own.items()  # what still reads
               if _verdicts(verdicts)} if isinstance(earlier_own, dict) else {}
        if artifact is not None and decided:
            own[artifact] = {**own.get(artifact, {}), **decided}
        body = {"cpu": native.cpu_name(), "left_out": sorted(chosen),
                "measured": {**(earlier if isinstance(earlier, dict) else {}), **measured}, "by_artifact": own}
        write_whole(path, json.dumps(body, indent=2))
    return path, _combined(chosen, own.get(artifact, {}) if artifact is not None else {})


def _read(path: Path) -> dict:
    """The record's contents, or {} where there is none or it is damaged (this measurement starts it again)."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) and isinstance(body.get("left_out", []), list) else {}


def forget() -> bool:
    """Removes this machine's record (every kernel runs again); whether there was one."""
    path = record_path()
    if not path.is_file():
        return False
    path.unlink()
    return True
