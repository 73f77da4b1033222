"""The artifact: a directory of graphs, configs, tokenizer files and `manifest.json`.

The manifest records where the model came from (and a hash of its weights), the options and
versions that built it, and each graph's inputs, outputs and file hash. It is written last and the
whole directory is built in a temporary sibling and moved into place, so an interrupted export never
leaves a half-written artifact. Loading checks every recorded file before any graph is opened.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import filelock

from hotrod.errors import HotrodError
from hotrod.files import file_sha256, inside
from hotrod.version import __version__

MANIFEST = "manifest.json"
FORMAT = 6  # bump when an older hotrod could misread a newer artifact (or the reverse); 3: in-place decoder caches;
#            4: encoders end in their task's head; 5: the seq2seq step takes several tokens (a draft to verify);
#            6: the seq2seq step reads one cross K/V per source, shared by that source's rows


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict


def graph_files(directory: Path, entries: dict[str, dict]) -> dict[str, Path]:
    """Each graph's file, from its manifest entry."""
    return {name: directory / entry["file"] for name, entry in entries.items()}


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


@contextmanager
def staging(out: Path, force: bool) -> Iterator[Path]:
    """A temporary directory beside `out` that replaces `out` whole when the block succeeds.

    A lock beside `out` (`.<name>.lock`, for as long as the block runs) makes a second writer of the same
    `out` fail at once instead of interleaving with the first. The new artifact
    takes the old one's place in one rename, so a reader never finds `out` missing or half-written. A
    full disk or a permission error is one line, and the staging directory and the lock file go either way.
    """
    if out.exists() and not out.is_dir():
        raise HotrodError(f"output path {out} exists and is not a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with _writer_lock(out):
            if out.exists() and any(out.iterdir()) and not force:
                raise HotrodError(f"output directory {out} already exists and is not empty; use --force to replace it")
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
            try:
                yield tmp
                os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp made it private; the artifact is an ordinary directory
                _move_into_place(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise HotrodError(f"cannot write {out}: {exc.strerror or exc}") from None


@contextmanager
def _writer_lock(out: Path) -> Iterator[None]:
    """Hold `.<name>.lock` beside `out`, and remove it before letting go.

    Removing it while held is safe with filelock's Unix lock: a contender that opened the old file finds
    it unlinked once it gets the lock (no links left) and starts over on a new one.
    """
    path = out.parent / f".{out.name}.lock"
    lock = filelock.FileLock(path, timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise HotrodError(f"another hotrod process is writing {out}; wait for it to finish") from None
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        lock.release()


def _move_into_place(tmp: Path, out: Path) -> None:
    """`tmp` becomes `out`; an old `out` ends up in `tmp` (removed by the caller)."""
    if not out.exists() or not any(out.iterdir()):
        os.replace(tmp, out)  # a rename onto an empty directory replaces it
    elif not _exchange(tmp, out):  # no atomic swap here: two renames, a moment without `out`
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux's renameat2 with RENAME_EXCHANGE); False where unsupported.

    Python's os module has no binding for it, hence ctypes.
    """
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform == "linux" else None
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a filesystem or kernel without it
        return False
    raise OSError(code, os.strerror(code), str(b))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_entry(directory: Path, name: str) -> dict:
    file = directory / name
    return {"file": name, "bytes": file.stat().st_size, "sha256": file_sha256(file)}


def write_manifest(directory: Path, manifest: dict) -> None:
    manifest = {"format": FORMAT, "hotrod_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **manifest}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def open_artifact(path: str | Path, check_hashes: bool = True) -> Artifact:
    """Read and check an artifact; any missing, altered or incompatible file is a clear error."""
    path = Path(path)
    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        raise HotrodError(f"{path} is not a hotrod artifact (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_file.read_text())
        fmt = manifest["format"]
        graphs = manifest["graphs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HotrodError(f"{manifest_file} is unreadable or incomplete: {exc}") from None
    if fmt != FORMAT:
        made_by = manifest.get("hotrod_version", "an unknown version")
        raise HotrodError(
            f"{path} was made by hotrod {made_by} (artifact format {fmt}); hotrod {__version__} reads format "
            f"{FORMAT}; run `hotrod optimize` again"
        )
    for entry in _entries(manifest_file, graphs, manifest.get("files", {})):
        _check_file(path, entry, check_hashes)
    return Artifact(path=path, manifest=manifest)


def _entries(manifest_file: Path, graphs: object, files: object) -> list[dict]:
    """Every file entry of the manifest (graphs, their external data, configs); a malformed one is one line."""
    try:
        entries = [*graphs.values(), *files.values()]  # type: ignore[attr-defined]
        entries += [{"file": e["external_data"]["file"], **e["external_data"]} for e in graphs.values()  # type: ignore[attr-defined]
                    if e.get("external_data")]
        for entry in entries:
            if not (isinstance(entry["file"], str) and isinstance(entry["bytes"], int) and isinstance(entry["sha256"], str)):
                raise TypeError(f"bad entry {entry!r}")
    except (AttributeError, KeyError, TypeError) as exc:
        raise HotrodError(f"{manifest_file} is unreadable or incomplete: {exc}") from None
    return entries


def _check_file(directory: Path, entry: dict, check_hashes: bool) -> None:
    file = inside(directory, entry["file"], f"the manifest of {directory}")
    if not file.is_file():
        raise HotrodError(f"artifact {directory} is missing {entry['file']}")
    if file.stat().st_size != entry["bytes"] or (check_hashes and file_sha256(file) != entry["sha256"]):
        raise HotrodError(f"artifact file {file} is corrupt (its size or hash differs from the manifest)")
