"""Files a run appends records to (``trace=PATH``): never through a symbolic link, never a FIFO.

:func:`check_target` is the early check (before any expensive work): the folder exists, and the
path is not a symbolic link and, if it exists, a regular file. :func:`open_records` opens the
file with ``O_NOFOLLOW`` (a link planted at the path after the check is refused, its target
never written) and ``O_NONBLOCK`` (a FIFO is refused at once instead of waiting for a reader).
Both fail with a one-line :class:`UnwritableTarget` (a ``ValueError``) naming the argument.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnwritableTarget(ValueError):
    """An output path that cannot be written as asked (one line)."""


def check_target(path: str | os.PathLike, what: str) -> Path:
    """``path`` when a run may create or append to it (module docstring); ``what`` names the
    argument in the error (``"trace"``)."""
    path = Path(path).expanduser()
    folder = path.parent
    if not folder.is_dir():
        raise UnwritableTarget(f"{what}={str(path)!r}: the folder {folder} does not exist")
    if path.is_symlink():
        raise UnwritableTarget(f"{what}={str(path)!r} is a symbolic link (to {os.readlink(path)}); "
                               f"name the file itself")
    if path.exists() and not path.is_file():
        raise UnwritableTarget(f"{what}={str(path)!r} exists and is not a regular file")
    if not os.access(folder, os.W_OK):
        raise UnwritableTarget(f"{what}={str(path)!r}: the folder {folder} is not writable")
    return path


def open_records(path: str | os.PathLike, *, truncate: bool, what: str = "trace"):
    """``path`` opened for appending text (UTF-8), emptied first when ``truncate``."""
    flags = (os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise UnwritableTarget(f"{what}={str(path)!r}: cannot open it for writing "
                               f"({exc.strerror or exc}; a symbolic link is refused)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnwritableTarget(f"{what}={str(path)!r} is not a regular file")
        if truncate:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
