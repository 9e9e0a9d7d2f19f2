"""Plain data across a pipe as Python literals: the only thing that passes between the
candidate's process and the checker's.

A value is first turned into a *tagged tree* made of ``None``, ``bool``, ``int``, finite
``float``, ``str``, ``bytes`` and tuples, where every tuple is a tag: ``("l", items)`` a
list, ``("t", items)`` a tuple, ``("d", ((k, v), ...))`` a dict, ``("s", items)`` a set,
``("S", items)`` a frozenset, ``("c", re, im)`` a complex, ``("f", "inf" | "-inf" | "nan")``
a non-finite float. Its ``ascii()`` text is what travels; the receiver parses it with
:func:`ast.literal_eval` and rebuilds the value from builtin types only, so no object of
the sender's (no ``__eq__``, no ``__del__``, no subclass) ever exists on the receiving side.

Frames on the pipe: 4-byte big-endian length, then that many bytes of ASCII text.
This module imports only the standard library: it also runs inside the sandboxes.
"""

from __future__ import annotations

import ast
import math
import os

#: largest frame accepted, in bytes (a bigger one is a protocol error, not an allocation)
MAX_FRAME = 32 << 20


class NotPlainData(TypeError):
    """The value holds something that is not plain data (a function, an object, ...)."""


class ProtocolError(RuntimeError):
    """The other side sent something that is not a well-formed frame or tagged tree."""


class PeerGone(EOFError):
    """The other side closed its end of the pipe (it ended, crashed, or was killed)."""


def to_tree(value, *, lenient: bool = False):
    """The tagged tree of ``value``.

    Strict (the checker's arguments): only the builtin types themselves. ``lenient`` (the
    candidate's results): subclasses count as their builtin base (their own methods are
    ignored), and objects with a ``tolist()`` (numpy) as what it returns. Raises
    :class:`NotPlainData` for anything else.
    """
    t = type(value)
    if value is None or t is bool or t is str or t is bytes:
        return value
    if t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else ("f", repr(value))
    if t is complex:
        return ("c", to_tree(value.real), to_tree(value.imag))
    if t is list:
        return ("l", tuple(to_tree(v, lenient=lenient) for v in value))
    if t is tuple:
        return ("t", tuple(to_tree(v, lenient=lenient) for v in value))
    if t is dict:
        return ("d", tuple((to_tree(k, lenient=lenient), to_tree(v, lenient=lenient))
                           for k, v in value.items()))
    if t is set or t is frozenset:
        return ("s" if t is set else "S", tuple(to_tree(v, lenient=lenient) for v in value))
    if lenient:
        for base in (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset):
            if isinstance(value, base):
                if base in (list, tuple, set, frozenset):
                    plain = base(base.__iter__(value))
                elif base is dict:
                    plain = {k: dict.__getitem__(value, k) for k in dict.__iter__(value)}
                else:
                    plain = base.__new__(base, value) if base is not bool else bool(int(value))
                return to_tree(plain, lenient=True)
        tolist = getattr(value, "tolist", None)
        if callable(tolist):
            return to_tree(tolist(), lenient=True)
    raise NotPlainData(f"a value of type {t.__name__} is not plain data")


def from_tree(tree):
    """The value a tagged tree stands for (builtin types only); :class:`ProtocolError` for a
    tree that no :func:`to_tree` could have made."""
    t = type(tree)
    if tree is None or t in (bool, int, float, str, bytes):
        return tree
    if t is not tuple or not tree or type(tree[0]) is not str:
        raise ProtocolError(f"malformed value: {t.__name__}")
    tag, rest = tree[0], tree[1:]
    if tag == "f" and len(rest) == 1 and rest[0] in ("inf", "-inf", "nan"):
        return float(rest[0])
    if tag == "c" and len(rest) == 2:
        re_, im = from_tree(rest[0]), from_tree(rest[1])
        if type(re_) is not float or type(im) is not float:
            raise ProtocolError("malformed complex")
        return complex(re_, im)
    if len(rest) != 1 or type(rest[0]) is not tuple:
        raise ProtocolError(f"malformed value with tag {tag!r}")
    items = rest[0]
    if tag == "l":
        return [from_tree(v) for v in items]
    if tag == "t":
        return tuple(from_tree(v) for v in items)
    if tag == "s":
        return {from_tree(v) for v in items}
    if tag == "S":
        return frozenset(from_tree(v) for v in items)
    if tag == "d":
        out = {}
        for pair in items:
            if type(pair) is not tuple or len(pair) != 2:
                raise ProtocolError("malformed dict item")
            out[from_tree(pair[0])] = from_tree(pair[1])
        return out
    raise ProtocolError(f"unknown tag {tag!r}")


def dumps(message) -> bytes:
    """Frame for ``message`` (a tuple of a tag string and plain values, already trees)."""
    body = ascii(message).encode("ascii")
    if len(body) > MAX_FRAME:
        raise NotPlainData(f"message of {len(body)} bytes is over the {MAX_FRAME} byte limit")
    return len(body).to_bytes(4, "big") + body


def send(fd: int, message) -> None:
    data = memoryview(dumps(message))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise PeerGone("the other process closed the pipe")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def recv(fd: int):
    """The next message: a non-empty tuple whose first item is a str (literal_eval'd)."""
    size = int.from_bytes(_read_exactly(fd, 4), "big")
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes is over the {MAX_FRAME} byte limit")
    body = _read_exactly(fd, size)
    try:
        message = ast.literal_eval(body.decode("ascii"))
    except (ValueError, SyntaxError, UnicodeDecodeError, TypeError, MemoryError,
            RecursionError) as e:
        raise ProtocolError(f"frame is not a plain literal ({type(e).__name__})") from None
    if type(message) is not tuple or not message or type(message[0]) is not str:
        raise ProtocolError("message is not a tagged tuple")
    return message
