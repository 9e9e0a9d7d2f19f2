"""Bounded reads of files a user, a checkpoint folder or another tool supplies.

:func:`read_bytes` opens without blocking (``O_NONBLOCK``: a FIFO opens at once instead of
waiting for a writer), accepts only a regular file (a FIFO, a device such as a link to
``/dev/zero``, a socket or a folder is refused, never waited on or read forever) of at most
``limit`` bytes, and reads no more than that even if the file grows meanwhile. Every failure
is a one-line :class:`UnreadableFile` (a ``ValueError``) naming the file and what it is.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnreadableFile(ValueError):
    """A file that cannot be read as asked: ``"{path}: {reason}"``, one line."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` of them (module docstring);
    ``what`` names the file in errors ("vocab artifact", "tokenizer file", ...)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UnreadableFile(path, f"cannot read the {what} ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(path, f"the {what} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UnreadableFile(path, f"{st.st_size} bytes is too large for a {what} (at most "
                                 f"{limit})")
        chunks, total = [], 0
        while True:
            try:
                block = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as exc:
                raise UnreadableFile(path, f"cannot read the {what} ({exc.strerror or exc})") from None
            if not block:
                return b"".join(chunks)
            chunks.append(block)
            total += len(block)
            if total > limit:
                raise UnreadableFile(path, f"more than {limit} bytes is too large for a {what} "
                                     f"(it grew while read)")
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, limit: int, what: str = "file") -> str:
    """:func:`read_bytes` decoded as UTF-8 (a one-line error otherwise)."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(path, f"the {what} is not UTF-8 ({exc.reason} at byte "
                             f"{exc.start})") from None


def read_json(path: str | os.PathLike, limit: int, what: str = "file"):
    """:func:`read_bytes` parsed as UTF-8 JSON; bytes that are not UTF-8, a syntax error or
    nesting too deep for the parser are a one-line error."""
    data = read_bytes(path, limit, what)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:     # UnicodeDecodeError is a ValueError
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnreadableFile(path, f"not a readable JSON {what} ({why})") from None


def copy_file(src: str | os.PathLike, dst: str | os.PathLike, limit: int, what: str = "file") -> Path:
    """Copy regular file ``src`` (at most ``limit`` bytes, :func:`read_bytes`) to ``dst``."""
    Path(dst).write_bytes(read_bytes(src, limit, what))
    return Path(dst)
