"""Atomic file writes: a reader sees the old file or the new one, never a part of either.

:func:`write_bytes` writes into a fresh temporary file of a unique name in the target's folder
(``tempfile.mkstemp``: created with ``O_EXCL``, so a link planted at a guessable name is never
followed), flushes and fsyncs it, renames it over the target with ``os.replace`` and fsyncs
the folder where the platform allows. Concurrent writers of the same target each rename their
own temporary file: all succeed, the last rename wins. A temporary file is removed when the
write fails. A target that is itself a symbolic link is replaced by the new file (the link's
destination is never written).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable; a no-op where folders cannot be opened (Windows) or synced."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> Path:
    """Replace ``path`` by ``data`` atomically (see the module docstring); ``mode``: the new
    file's permission bits before the umask. Creates the parent folders. Returns the path."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, mode & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """:func:`write_bytes` of ``text`` encoded with ``encoding``."""
    return write_bytes(path, text.encode(encoding))


def write_json(path: str | os.PathLike, data, *, indent: int | None = 1,
               ensure_ascii: bool = False, sort_keys: bool = False) -> Path:
    """:func:`write_text` of ``data`` as JSON followed by a newline."""
    return write_text(path, json.dumps(data, indent=indent, ensure_ascii=ensure_ascii,
                                       sort_keys=sort_keys) + "\n")
