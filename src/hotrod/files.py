"""Files that a manifest or a checkpoint's index names: kept inside their directory, and hashed; and files
hotrod writes whole or not at all.

Both the artifact (its manifest's files) and the loader (a sharded checkpoint's index, the weights'
hash an artifact records) read files named by someone else; the two checks live here, below both.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path, PurePosixPath, PureWindowsPath

from hotrod.errors import HotrodError


def inside(directory: Path, name: str, what: str) -> Path:
    """`directory / name`, refused unless `name` is a plain relative path that stays inside `directory`.

    A manifest or index written by someone else must not make hotrod read (or hash, or hand to a parser)
    a file elsewhere on the machine: no absolute paths, no `..`, no symlink that resolves outside.
    """
    relative = PurePosixPath(name)
    if not name or relative.is_absolute() or PureWindowsPath(name).is_absolute() or ".." in relative.parts \
            or "\\" in name:
        raise HotrodError(f"{what} names {name!r}, which is not a relative path inside {directory}")
    file = directory / relative
    root = directory.resolve()
    if not file.resolve().is_relative_to(root):
        raise HotrodError(f"{what} names {name!r}, a link that leads outside {directory}")
    return file


def file_sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def write_whole(path: Path, text: str) -> Path:
    """`text` at `path`, whole or not at all: a reader never meets half a file, and a failed write leaves no
    file of its own behind (a temporary file beside `path`, flushed to disk, renamed into place)."""
    fd, name = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)  # as any file this user writes, not mkstemp's owner-only
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return path
