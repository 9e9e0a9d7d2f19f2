"""The two programs that run inside the sandboxes: ``candidate`` and ``checker``.

Started as ``python -I -S -B inside.py ROLE JOB_FD IN_FD OUT_FD [VERDICT_FD]`` (the host
side, :mod:`pvf_lmeval.sandbox.run`, builds that command). Imports only the standard
library and :mod:`literals` beside this file.

Both first read their job (JSON) from ``JOB_FD``; in bwrap (the job's limits name
``tmpfs_inodes``) they mount a /tmp of their own, limited in bytes and in files, in a mount
namespace of their own, and drop every capability (:func:`_own_tmp`); then they set the
resource limits, point stdout and stderr at /dev/null and close every descriptor they were not
given. ``python inside.py probe`` does the mount and the drop alone (bwrap's start-up check).
Then:

- ``candidate`` runs the model's program (prompt + completion) and serves calls of its entry
  point: it reads ``("call", args, kwargs)`` from ``IN_FD`` and answers on ``OUT_FD`` with
  ``("return", value)`` or ``("raise", type name, message)``. Its first message says how the
  program loaded: ``("ready",)``, ``("syntax", detail)`` or ``("raised", type, message)``.
  Nothing it sends is trusted: it is model-controlled code from its first line on.
- ``checker`` runs the dataset's code, which is trusted: the prompt (so its helper functions
  exist here too), then the test with the entry point bound to a proxy that forwards each
  call to the candidate. It writes its verdict to ``VERDICT_FD``: ``("passed",)`` when
  ``check(proxy)`` returned, else ``("failed", kind, detail)`` with kind ``syntax``,
  ``failed``, ``memory``, ``ended`` (the candidate's process went away mid-check) or
  ``unchecked`` (the problem itself cannot be checked this way); ``("error", detail)`` if
  the checker program itself failed.
"""

import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import literals  # noqa: E402  (the sandbox's own sys.path, set just above)

DETAIL_CHARS = 500


def _read_job(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return json.loads(b"".join(chunks).decode("utf-8"))


def _limit(which, soft, hard=None):
    hard = soft if hard is None else hard
    cur_soft, cur_hard = resource.getrlimit(which)
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    resource.setrlimit(which, (soft, hard))


def _confine(limits, keep_fds):
    """Resource limits, quiet stdio, and no descriptor but ``keep_fds``."""
    cpu = int(limits["cpu_s"])
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)           # SIGXCPU, then SIGKILL a second later
    _limit(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    _limit(resource.RLIMIT_FSIZE, int(limits["fsize_bytes"]))
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_NOFILE, int(limits["nofile"]))
    # No fork, no thread. Counted per user in this sandbox's user namespace, and not applied
    # at all where that maps to root outside: bwrap's seccomp filter is what holds there.
    _limit(resource.RLIMIT_NPROC, int(limits["nproc"]))
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.closerange(3, min(keep_fds))
    for lo, hi in zip(sorted(keep_fds), sorted(keep_fds)[1:] + [1 << 16]):
        os.closerange(lo + 1, hi)


_CLONE_NEWNS, _MS_NOSUID, _MS_NODEV = 0x00020000, 2, 4
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_VERSION_3 = 0x20080522


def _own_tmp(size, inodes):
    """Mount a fresh tmpfs on /tmp (``size`` bytes, ``inodes`` files: the kernel memory of a
    tmpfs's inodes is not counted in its size) in a mount namespace of this process's own, make
    it the working folder, then drop every capability bwrap granted for this (CAP_SYS_ADMIN in
    the sandbox's user namespace). Raises OSError when any step fails: nothing runs then."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def ok(result, what):
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    ok(libc.unshare(_CLONE_NEWNS), "unshare the mount namespace")
    ok(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                  f"size={int(size)},nr_inodes={int(inodes)},mode=700".encode()), "mount /tmp")
    os.chdir("/tmp")
    for cap in range(64):       # the bounding set, where CAP_SETPCAP allows (EINVAL past the last)
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    ok(libc.capset(ctypes.byref(Header(_CAP_VERSION_3, 0)), (Data * 2)()), "drop capabilities")
    with open("/proc/self/status") as f:
        caps = {k: int(v, 16) for k, v in (line.split(":") for line in f)
                if k in ("CapInh", "CapPrm", "CapEff", "CapAmb")}
    if any(caps.values()) or len(caps) != 4:
        raise OSError(0, f"capabilities left after the drop: {caps}")


def _one_line(text):
    return " ".join(str(text).split())[:DETAIL_CHARS]


def _describe(exc):
    """(type name, message) of an exception, both plain strings; its own ``__str__`` and its
    class's ``__name__`` (a metaclass may make it a property returning anything, or raising)
    may fail or lie, which only changes the detail of a failure, never a verdict."""
    try:
        msg = str(exc)
        msg = msg if type(msg) is str else "<unprintable message>"
    except BaseException:  # noqa: BLE001  (a message that cannot be printed)
        msg = "<unprintable message>"
    try:
        name = type.__dict__["__name__"].__get__(type(exc))   # the class's own name, no lookup
    except BaseException:  # noqa: BLE001
        name = None
    if type(name) is not str:
        name = "<unnamed exception>"
    return name, _one_line(msg)


def _say(name, message):
    """``name: message`` from values received across a pipe (any literal): always a string."""
    name = name if type(name) is str else repr(name)
    message = message if type(message) is str else repr(message)
    return f"{name}: {message}" if message else name


# ------------------------------------------------------------------------- candidate

def candidate(job, in_fd, out_fd):
    try:
        code = compile(job["program"], "<candidate>", "exec")
    except SyntaxError as e:
        where = f" (line {e.lineno})" if e.lineno else ""
        literals.send(out_fd, ("syntax", _one_line(f"SyntaxError: {e.msg}{where}")))
        return
    except (ValueError, MemoryError, RecursionError) as e:   # NUL bytes, nesting, ...
        literals.send(out_fd, ("syntax", _one_line(f"{type(e).__name__}: {e}")))
        return
    del job["program"]
    send, recv = literals.send, literals.recv
    to_tree = literals.to_tree
    entry = job["entry_point"]
    g = {}
    try:
        exec(code, g)
        fn = g[entry]
        if not callable(fn):
            raise TypeError(f"{entry} is not callable")
    except BaseException as e:  # noqa: BLE001  (anything the program raised, SystemExit too)
        send(out_fd, ("raised",) + _describe(e))
        return
    send(out_fd, ("ready",))
    while True:
        try:
            msg = recv(in_fd)
        except literals.PeerGone:
            return
        if msg[0] != "call" or len(msg) != 3:
            return
        args = literals.from_tree(msg[1])
        kwargs = literals.from_tree(msg[2])
        try:
            value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            reply = ("raise",) + _describe(e)
        else:
            try:
                reply = ("return", to_tree(value, lenient=True))
                literals.dumps(reply)
            except (literals.NotPlainData, ValueError, RecursionError, MemoryError) as e:
                reply = ("raise", "TypeError", _one_line(f"the result cannot cross: {e}"))
        send(out_fd, reply)


# ------------------------------------------------------------------------- checker

class CandidateError(Exception):
    """The candidate raised an exception that has no builtin Exception class here."""


class CandidateEnded(Exception):
    """The candidate's process went away (exit, signal, limit) before answering."""


class Uncheckable(Exception):
    """The check passed the candidate something that cannot cross as plain data."""


def _rebuild_exception(name, message):
    import builtins
    cls = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001  (e.g. UnicodeDecodeError needs five arguments)
            pass
    return CandidateError(f"{name}: {message}")


def _make_proxy(in_fd, out_fd):
    def candidate(*args, **kwargs):
        try:
            request = ("call", literals.to_tree(args), literals.to_tree(kwargs))
        except literals.NotPlainData as e:
            raise Uncheckable(f"an argument cannot cross as plain data: {e}") from None
        try:
            literals.send(out_fd, request)
            reply = literals.recv(in_fd)
        except (literals.PeerGone, BrokenPipeError):
            raise CandidateEnded("the candidate's process ended before answering") from None
        if reply[0] == "return" and len(reply) == 2:
            return literals.from_tree(reply[1])
        if reply[0] == "raise" and len(reply) == 3:
            raise _rebuild_exception(reply[1], reply[2])
        raise literals.ProtocolError(f"unexpected reply {reply[0]!r}")
    return candidate


def checker(job, in_fd, out_fd, verdict_fd):
    def verdict(*message):
        literals.send(verdict_fd, message)

    try:
        hello = literals.recv(in_fd)
    except literals.PeerGone:
        return verdict("failed", "ended", "the candidate's process ended before it loaded")
    except literals.ProtocolError as e:
        return verdict("failed", "failed", _one_line(e))
    if type(hello) is not tuple or not hello:
        return verdict("failed", "failed", "the candidate's process sent no greeting")
    if hello[0] == "syntax":
        return verdict("failed", "syntax", _one_line(hello[1] if len(hello) > 1 else ""))
    if hello[0] == "raised" and len(hello) == 3:
        kind = "memory" if hello[1] == "MemoryError" else "failed"
        return verdict("failed", kind, _one_line("while loading: " + _say(hello[1], hello[2])))
    if hello != ("ready",):
        return verdict("failed", "failed", "the candidate's process sent no greeting")
    proxy = _make_proxy(in_fd, out_fd)
    ns = {}
    try:
        exec(compile(job["prompt"], "<prompt>", "exec"), ns)
        ns[job["entry_point"]] = proxy
        exec(compile(job["test"], "<test>", "exec"), ns)
        check = ns["check"]
    except BaseException as e:  # noqa: BLE001  (trusted code that does not run: not the model's fault)
        return verdict("failed", "unchecked", _one_line("the prompt or test does not run: "
                                                        + _say(*_describe(e))))
    try:
        check(proxy)
    except Uncheckable as e:
        return verdict("failed", "unchecked", _one_line(e))
    except CandidateEnded as e:
        return verdict("failed", "ended", _one_line(e))
    except MemoryError as e:
        return verdict("failed", "memory", _one_line(_say(*_describe(e))))
    except BaseException as e:  # noqa: BLE001
        return verdict("failed", "failed", _one_line(_say(*_describe(e))))
    verdict("passed")


def main(argv):
    role = argv[1]
    if role == "probe":
        _own_tmp(1 << 20, 64)
        return
    fds = [int(a) for a in argv[2:]]
    job = _read_job(fds[0])
    limits = job["limits"]
    if "tmpfs_inodes" in limits:
        _own_tmp(limits["tmpfs_bytes"], limits["tmpfs_inodes"])
    _confine(limits, fds[1:])
    if role == "candidate":
        candidate(job, fds[1], fds[2])
    elif role == "checker":
        try:
            checker(job, fds[1], fds[2], fds[3])
        except BaseException as e:  # noqa: BLE001  (a fault of this program: say so)
            literals.send(fds[3], ("error", _one_line(_say(*_describe(e)))))
            raise
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv)
