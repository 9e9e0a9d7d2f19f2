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

- ``candidate`` runs the model's program (prompt + completion) and serves calls of its
  functions: it reads ``("call", name, args, kwargs)`` from ``IN_FD`` and answers on ``OUT_FD``
  with ``("return", value)``, ``("raise", type name, message)`` or, for a result that is not
  plain data where the job names ``names``, ``("opaque", detail)``. Its first message says how
  the program loaded: ``("ready",)`` (a job with ``entry_point``: that one function is served),
  ``("ready", kinds)`` (a job with ``names``: what the program's globals hold under each name,
  :func:`_kind`), ``("syntax", detail)`` or ``("raised", type, message)``. Nothing it sends is
  trusted: it is model-controlled code from its first line on.
- ``checker`` runs the dataset's code, which is trusted. With ``entry_point`` (HumanEval): the
  prompt (so its helper functions exist here too), then the test with the entry point bound to
  a proxy that forwards each call to the candidate, then ``check(proxy)``. With ``asserts``
  (MBPP): the ``setup`` code, then each assert line in a namespace where the names the job
  lists resolve as the candidate's globals do, but plain (:func:`_bind`): a function to a
  proxy, a plain-data value to its literal, a standard-library module to the checker's own
  import; builtins are always the checker's own. It writes its verdict to ``VERDICT_FD``:
  ``("passed",)`` when the check returned, else ``("failed", kind, detail)`` with kind
  ``syntax``, ``failed``, ``memory``, ``ended`` (the candidate's process went away mid-check),
  ``opaque`` (``asserts`` only: the check needed a value that cannot cross as plain data, in
  either direction) or ``unchecked`` (the problem itself cannot be checked this way);
  ``("error", detail)`` if the checker program itself failed. Ending and values that cannot
  cross are sticky: a test that swallows the exception still gets that verdict.
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
    return _type_name(exc, "<unnamed exception>"), _one_line(msg)


def _type_name(value, unnamed="<unnamed type>"):
    """The name of ``value``'s class, read from the class itself (no attribute look-up a
    metaclass could redirect); ``unnamed`` where that is not a string."""
    try:
        name = type.__dict__["__name__"].__get__(type(value))
    except BaseException:  # noqa: BLE001
        name = None
    return name if type(name) is str else unnamed


def _say(name, message):
    """``name: message`` from values received across a pipe (any literal): always a string."""
    name = name if type(name) is str else repr(name)
    message = message if type(message) is str else repr(message)
    return f"{name}: {message}" if message else name


# ------------------------------------------------------------------------- candidate

def _kind(g, name):
    """What the program's globals ``g`` hold under ``name``, as plain data: ``("callable",)``,
    ``("module", its name)``, ``("value", tagged tree)``, ``("opaque", type name)`` or
    ``("missing",)``."""
    if name not in g:
        return ("missing",)
    value = g[name]
    if type(value) is type(sys):
        module = value.__name__
        return ("module", module if type(module) is str else "")
    if callable(value):
        return ("callable",)
    try:
        tree = literals.to_tree(value, lenient=True)
        literals.dumps(("value", tree))
    except (literals.NotPlainData, ValueError, RecursionError, MemoryError):
        return ("opaque", _type_name(value))
    return ("value", tree)


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
    entry = job.get("entry_point")
    names = job.get("names", ())
    g = {}
    try:
        exec(code, g)
        if entry is not None:
            fns = {entry: g[entry]}
            if not callable(fns[entry]):
                raise TypeError(f"{entry} is not callable")
            hello = ("ready",)
        else:
            kinds = tuple((name, _kind(g, name)) for name in names)
            fns = {name: g[name] for name, kind in kinds if kind == ("callable",)}
            hello = ("ready", kinds)
    except BaseException as e:  # noqa: BLE001  (anything the program raised, SystemExit too)
        send(out_fd, ("raised",) + _describe(e))
        return
    send(out_fd, hello)
    while True:
        try:
            msg = recv(in_fd)
        except literals.PeerGone:
            return
        if msg[0] != "call" or len(msg) != 4 or msg[1] not in fns:
            return
        args = literals.from_tree(msg[2])
        kwargs = literals.from_tree(msg[3])
        try:
            value = fns[msg[1]](*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            reply = ("raise",) + _describe(e)
        else:
            try:
                reply = ("return", to_tree(value, lenient=True))
            except literals.NotPlainData as e:
                reply = ("raise", "TypeError", _one_line(f"the result cannot cross: {e}")) \
                    if entry is not None else ("opaque", _one_line(e))
            except (ValueError, RecursionError, MemoryError) as e:
                reply = ("raise", "TypeError", _one_line(f"the result cannot cross: {e}"))
            try:
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
    """The check needed a value that cannot cross as plain data."""


def _rebuild_exception(name, message):
    import builtins
    cls = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001  (e.g. UnicodeDecodeError needs five arguments)
            pass
    return CandidateError(f"{name}: {message}")


class _Link:
    """The checker's end of the pipes to the candidate. It remembers that the candidate ended
    and that a value could not cross (``ended``, ``uncrossable``): the verdict says so even when
    the test code swallows the exception it raised. ``opaque_results``: whether the candidate
    may answer that a result cannot cross (``asserts``); with ``entry_point`` it answers a
    TypeError instead, and a candidate's claim otherwise is a protocol error, so that no
    program can make its problem look uncheckable."""

    def __init__(self, in_fd, out_fd, opaque_results):
        self.in_fd, self.out_fd = in_fd, out_fd
        self.opaque_results = opaque_results
        self.ended = self.uncrossable = None

    def refuse(self, why):
        self.uncrossable = self.uncrossable or _one_line(why)
        raise Uncheckable(why)

    def call(self, name, args, kwargs):
        if self.ended:
            raise CandidateEnded(self.ended)
        try:
            request = ("call", name, literals.to_tree(args), literals.to_tree(kwargs))
        except literals.NotPlainData as e:
            for arg in (*args, *kwargs.values()):   # a global of the program's, named
                if type(arg) is _Opaque:
                    arg._refuse()
            self.refuse(f"an argument cannot cross as plain data: {e}")
        try:
            literals.send(self.out_fd, request)
            reply = literals.recv(self.in_fd)
        except (literals.PeerGone, BrokenPipeError):
            self.ended = "the candidate's process ended before answering"
            raise CandidateEnded(self.ended) from None
        if reply[0] == "return" and len(reply) == 2:
            return literals.from_tree(reply[1])
        if reply[0] == "raise" and len(reply) == 3:
            raise _rebuild_exception(reply[1], reply[2])
        if reply[0] == "opaque" and len(reply) == 2 and self.opaque_results:
            self.refuse(f"the result of {name} cannot cross: {_say(reply[1], '')}")
        raise literals.ProtocolError(f"unexpected reply {reply[0]!r}")

    def proxy(self, name):
        def candidate(*args, **kwargs):
            return self.call(name, args, kwargs)
        return candidate


class _Opaque:
    """Stands for a global of the candidate's that is not plain data (an instance, a module
    outside the standard library): any use of it, passing it to the candidate included, is a
    value that cannot cross."""

    def __init__(self, link, name, what):
        object.__setattr__(self, "_why", (link, f"{name} is {what}, not plain data"))

    def _refuse(self, *args, **kwargs):
        link, why = object.__getattribute__(self, "_why")
        link.refuse(why)

    __getattr__ = __setattr__ = __call__ = __bool__ = __len__ = __iter__ = _refuse
    __getitem__ = __contains__ = __hash__ = __index__ = __int__ = __float__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __str__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse


def _bind(ns, kinds, names, link):
    """Bind in ``ns`` what the candidate's globals hold under each of ``names``, as its greeting
    ``kinds`` says (:func:`_kind`): a function (or class) to a proxy, a plain value to its
    literal, a standard-library module to the checker's own import of it, anything else to an
    :class:`_Opaque`; a missing name stays unbound (a NameError, as in one namespace)."""
    import importlib

    if type(kinds) is not tuple or len(kinds) != len(names):
        raise literals.ProtocolError("the greeting does not describe the names asked for")
    for item, name in zip(kinds, names):
        if type(item) is not tuple or len(item) != 2 or item[0] != name or \
                type(item[1]) is not tuple or not item[1]:
            raise literals.ProtocolError("the greeting does not describe the names asked for")
        tag, rest = item[1][0], item[1][1:]
        if tag == "callable" and not rest:
            ns[name] = link.proxy(name)
        elif tag == "value" and len(rest) == 1:
            ns[name] = literals.from_tree(rest[0])
        elif tag == "module" and len(rest) == 1 and type(rest[0]) is str and \
                rest[0].partition(".")[0] in sys.stdlib_module_names:
            ns[name] = importlib.import_module(rest[0])
        elif tag in ("module", "opaque") and len(rest) == 1:
            what = "module" if tag == "module" else "object"
            ns[name] = _Opaque(link, name, f"a {_say(rest[0], '')} {what}")
        elif tag != "missing" or rest:
            raise literals.ProtocolError(f"unknown kind for {name}")


def _greeting(in_fd):
    """The candidate's first message, or the verdict ``("failed", kind, detail)`` that it
    implies (it did not load, or sent no greeting)."""
    try:
        hello = literals.recv(in_fd)
    except literals.PeerGone:
        return None, ("ended", "the candidate's process ended before it loaded")
    except literals.ProtocolError as e:
        return None, ("failed", _one_line(e))
    if hello[0] == "syntax":
        return None, ("syntax", _one_line(hello[1] if len(hello) > 1 else ""))
    if hello[0] == "raised" and len(hello) == 3:
        kind = "memory" if hello[1] == "MemoryError" else "failed"
        return None, (kind, _one_line("while loading: " + _say(hello[1], hello[2])))
    if hello[0] != "ready" or len(hello) > 2:
        return None, ("failed", "the candidate's process sent no greeting")
    return hello, None


def _judge(run, link, opaque):
    """The verdict ``(kind, detail)`` of ``run()`` (the trusted check; ``None`` when it passes):
    what the link remembers first, then the exception. ``opaque``: the kind for a value that
    cannot cross (``opaque`` for ``asserts``, ``unchecked`` for ``entry_point``). ``run``
    returns a suffix for the detail of an exception (which assert raised it), or ``None``."""
    where = []
    try:
        run(where)
        error = None
    except BaseException as e:  # noqa: BLE001  (judged below)
        error = e
    if link.uncrossable:
        return opaque, link.uncrossable
    if link.ended:
        return "ended", link.ended
    if error is None:
        return None
    detail = _one_line(_say(*_describe(error)) + "".join(where))
    return ("memory" if isinstance(error, MemoryError) else "failed"), detail


def checker(job, in_fd, out_fd, verdict_fd):
    def verdict(*message):
        literals.send(verdict_fd, message)

    hello, failed = _greeting(in_fd)
    if failed:
        return verdict("failed", *failed)
    asserts = job.get("asserts")
    link = _Link(in_fd, out_fd, opaque_results=asserts is not None)
    ns = {}
    try:
        if asserts is None:
            if hello != ("ready",):
                return verdict("failed", "failed", "the candidate's process sent no greeting")
            exec(compile(job["prompt"], "<prompt>", "exec"), ns)
            ns[job["entry_point"]] = link.proxy(job["entry_point"])
            exec(compile(job["test"], "<test>", "exec"), ns)
            check = ns["check"]
            run = lambda where: check(link.proxy(job["entry_point"]))  # noqa: E731
        else:
            tests = [compile(a, f"<assert {i + 1}>", "exec") for i, a in enumerate(asserts)]
            exec(compile(job["setup"], "<setup>", "exec"), ns)
    except BaseException as e:  # noqa: BLE001  (trusted code that does not run: not the model's fault)
        return verdict("failed", "unchecked", _one_line("the prompt or test does not run: "
                                                        + _say(*_describe(e))))
    if asserts is not None:
        if len(hello) != 2:
            return verdict("failed", "failed", "the candidate's process sent no greeting")
        try:
            _bind(ns, hello[1], job["names"], link)
        except literals.ProtocolError as e:
            return verdict("failed", "failed", _one_line(e))

        def run(where):
            for i, test in enumerate(tests):
                where[:] = [f" (assert {i + 1} of {len(tests)})"]
                exec(test, ns)
    judged = _judge(run, link, "unchecked" if asserts is None else "opaque")
    if judged is None:
        return verdict("passed")
    verdict("failed", *judged)


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
