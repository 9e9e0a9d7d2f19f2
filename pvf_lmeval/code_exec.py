"""Run untrusted model-written programs in a sandboxed child process; the pass@k estimator.

:func:`run_program` runs one program (for HumanEval: ``prompt + completion + "\\n" + test +
"\\ncheck(entry_point)"``) in a fresh ``python -I -B`` child and returns an :class:`ExecResult`:
``passed`` (bool) and ``reason`` -- one of

- ``passed``: the program ran to its end without raising;
- ``failed``: it raised (a failed ``assert``, any exception, ``SyntaxError``, ``SystemExit``
  from ``sys.exit()``/``exit()``);
- ``timeout``: the wall-clock limit or the CPU-time limit (RLIMIT_CPU) was hit;
- ``error``: the sandbox refused an operation (even if the program caught the refusal), or
  the process ended without reporting (``os._exit``, a crash, a signal).

If the sandbox itself cannot be set up (the privilege drop fails, the interpreter does not
start), :class:`SandboxError` is raised instead: that is the machine's fault, not the program's.

What the child enforces, in this order, before any untrusted code runs:

1. It reads its job file from a fresh temporary directory (the working directory; ``HOME``
   and ``TMPDIR`` point there too) and deletes it.
2. Network: it moves into a new, empty network namespace (``unshare(CLONE_NEWNET)``; as a
   non-root user together with ``CLONE_NEWUSER``) when the kernel allows it; ``PR_SET_NO_NEW_PRIVS``
   is set. Whether or not that worked, the audit hook (6) refuses every ``socket.*`` event.
3. Limits: RLIMIT_CPU (``timeout`` CPU seconds, SIGXCPU then SIGKILL one second later),
   RLIMIT_AS (``memory_mb``), RLIMIT_FSIZE (``fsize_mb``), RLIMIT_CORE = 0 and RLIMIT_NPROC = 0
   (no fork, no threads for a non-root uid).
4. Privileges: started as root, it drops to an unprivileged uid/gid (65534, ``nobody``) with no
   supplementary groups and checks that ``setuid(0)`` fails; root-owned files are then out of
   reach and the rlimits bind. The interpreter's own (possibly root-only, e.g. under /root)
   ``sys.path`` directories stay importable through directory descriptors opened beforehand
   (``/proc/self/fd/N``). If the drop fails the program is not run (:class:`SandboxError`).
5. The parent-death signal is SIGKILL, so the child dies with its parent.
6. A ``sys.addaudithook`` hook, installed right before ``exec``, refuses (PermissionError, and
   the run counts as ``error``): opening for writing, creating, removing, renaming,
   truncating, chmod/chown/utime anything outside the temporary directory (``/dev/null`` is
   allowed); opening directories outside it (no ``dir_fd`` tricks) and ``/proc/*/mem``;
   links and symlinks; process creation and signals (``subprocess.Popen``, ``os.system``,
   ``os.exec*``, ``os.fork``, ``os.forkpty``, ``os.posix_spawn``, ``os.spawn*``, ``os.kill``,
   ...); sockets and network clients; ``gc`` object enumeration; tracing/profiling
   hooks, new audit hooks and ``resource.setrlimit``; ``ctypes`` may load libraries (numpy
   imports it) but not look up or call functions.

The result travels over a pipe, written by the audit hook itself with a random per-run
nonce that only the hook holds, and only when the runner's own frame asks (after ``exec``
returned or raised). So ``sys.exit(0)``, ``os._exit(0)``, printing "passed" or writing to the
pipe cannot fake a pass. This is a sandbox for model-written code on a machine you control,
defence in depth over the unprivileged uid; it is not a container, and a program that
deliberately attacks CPython internals is out of its scope.

:func:`pass_at_k` is the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)``.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["ExecResult", "SandboxError", "run_program", "run_programs", "pass_at_k",
           "default_workers", "REASONS"]

REASONS = ("passed", "failed", "timeout", "error")
NOBODY = 65534
JOB_FILE = ".pvf_sandbox_job.json"
#: how much of the report pipe / stderr the parent reads back
_READ_LIMIT = 1 << 16


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed run."""

    passed: bool
    reason: str          # one of REASONS
    detail: str = ""     # exception, refused operation, signal, ... (one line)
    wall_s: float = 0.0


# --------------------------------------------------------------------------------------------
# The child. Passed to ``python -I -B -c``; argv[1] is the working directory. Self-contained:
# it may not import pvf_lmeval (site-packages may be unreadable once privileges are dropped).
# --------------------------------------------------------------------------------------------
_RUNNER = r'''
import os, sys


def _setup():
    import json, resource, signal
    workdir = sys.argv[1]
    job_path = workdir + "/" + JOB
    with open(job_path, "rb") as f:
        job = json.loads(f.read().decode("utf-8"))
    os.unlink(job_path)
    report_fd = job["report_fd"]
    nonce = job["nonce"]

    def early_report(status, detail):
        os.write(report_fd, ("%s\t%s\t%s\n" % (nonce, status, detail.replace("\n", " ")[:2000]))
                 .encode("utf-8", "replace"))

    try:
        root = os.geteuid() == 0
        ppid = os.getppid()
        # Keep the interpreter's sys.path importable after the privilege drop (it may live in
        # a root-only directory such as /root/.pyenv): reach it through directory descriptors.
        if root:
            if os.path.isdir("/proc/self/fd"):
                opened = {}

                def via_fd(p):
                    if p not in opened:
                        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
                        opened[p] = "/proc/self/fd/%d" % fd
                    return opened[p]

                sys.path[:] = [via_fd(p) for p in sys.path if p and os.path.isdir(p)]
                # packages imported at start-up (collections, encodings, ...) find their
                # submodules through __path__
                for mod in list(sys.modules.values()):
                    path = getattr(mod, "__path__", None)
                    if type(path) is list:
                        path[:] = [via_fd(p) if os.path.isdir(p) else p for p in path]
                sys.path_importer_cache.clear()
            else:
                for m in PRELOAD:
                    try:
                        __import__(m)
                    except Exception:
                        pass
        # Network namespace + no_new_privs (best effort), through libc.
        isolated = False
        libc = None
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            flags = 0x40000000 if root else (0x40000000 | 0x10000000)  # NEWNET [| NEWUSER]
            isolated = libc.unshare(flags) == 0
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        except Exception:
            pass
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update({"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin",
                           "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})

        def limit(which, value):
            soft, hard = resource.getrlimit(which)
            if not root and hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, value))

        cpu = job["cpu_s"]
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if root or hard == resource.RLIM_INFINITY or hard > cpu:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        limit(resource.RLIMIT_AS, job["memory_bytes"])
        limit(resource.RLIMIT_FSIZE, job["fsize_bytes"])
        limit(resource.RLIMIT_CORE, 0)
        limit(resource.RLIMIT_NPROC, 0)
        if root:
            os.setgroups([])
            os.setgid(job["gid"])
            os.setuid(job["uid"])
            if 0 in (os.getuid(), os.geteuid(), os.getgid(), os.getegid()):
                raise RuntimeError("still root after setuid")
            try:
                os.setuid(0)
            except PermissionError:
                pass
            else:
                raise RuntimeError("setuid(0) succeeded after the drop")
        if libc is not None:
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG (after setuid)
            if os.getppid() != ppid:
                os._exit(3)
        for m in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.")]:
            del sys.modules[m]
        del libc
    except BaseException as e:
        early_report("setup", "%s: %s" % (type(e).__name__, e))
        os._exit(0)
    try:
        code = compile(job["program"], "<candidate>", "exec")
    except SyntaxError as e:
        early_report("failed", "SyntaxError: %s (line %s)" % (e.msg, e.lineno))
        os._exit(0)
    except BaseException as e:  # null bytes, too deeply nested, ...
        early_report("failed", "%s: %s" % (type(e).__name__, e))
        os._exit(0)
    arm = _make_arm(nonce, report_fd, workdir)
    early_report("started", "network namespace" if isolated else "no network namespace")
    return code, arm


def _make_arm(nonce, report_fd, workdir):
    import stat as _stat
    getframe = sys._getframe
    addaudithook = sys.addaudithook
    write = os.write
    getcwd = os.getcwd
    lstat = os.lstat
    stat_ = os.stat
    readlink = os.readlink
    S_ISLNK = _stat.S_ISLNK
    S_ISDIR = _stat.S_ISDIR
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    root = workdir.rstrip("/")
    state = {"frame": None, "violation": None, "reported": False}
    REFUSE = frozenset((
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
        "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill", "os.startfile", "pty.spawn",
        "os.link", "os.symlink", "os.chroot",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "sys.addaudithook", "sys.settrace", "sys.setprofile", "sys._current_frames",
        "sys._current_exceptions", "resource.setrlimit", "resource.prlimit",
        "http.client.connect", "urllib.Request", "ftplib.connect", "smtplib.connect",
        "poplib.connect", "imaplib.open", "nntplib.connect", "telnetlib.Telnet.open",
        "webbrowser.open", "syslog.openlog", "syslog.syslog",
    ))
    REFUSE_PREFIX = ("socket.", "ctypes.", "_ctypes.")
    # event -> (positions of path arguments, position of their dir_fd or None, strict)
    PATH_EVENTS = {
        "os.remove": ((0,), 1), "os.rmdir": ((0,), 1), "os.mkdir": ((0,), 2),
        "os.rename": ((0, 1), 2), "os.truncate": ((0,), None), "os.chmod": ((0,), 2),
        "os.chown": ((0,), 3), "os.chflags": ((0,), None), "os.lchflags": ((0,), None),
        "os.lchmod": ((0,), None), "os.utime": ((0,), 3), "os.setxattr": ((0,), None),
        "os.removexattr": ((0,), None), "shutil.rmtree": ((0,), 1), "os.mkfifo": ((0,), 2),
        "os.mknod": ((0,), 3),
    }

    def resolve(p, base):
        if not p.startswith("/"):
            p = base + "/" + p
        todo = p.split("/")
        todo.reverse()
        out = []
        hops = 0
        while todo:
            c = todo.pop()
            if c == "" or c == ".":
                continue
            if c == "..":
                if out:
                    out.pop()
                continue
            cur = "/" + "/".join(out) + ("/" if out else "") + c
            try:
                st = lstat(cur)
            except OSError:
                out.append(c)
                continue
            if S_ISLNK(st.st_mode):
                hops += 1
                if hops > 40:
                    return None
                target = readlink(cur)
                if target.startswith("/"):
                    out = []
                parts = target.split("/")
                parts.reverse()
                todo.extend(parts)
                continue
            out.append(c)
        return "/" + "/".join(out)

    def as_str(p):
        t = type(p)
        if t is str:
            return p
        if t is bytes:
            return p.decode("utf-8", "surrogateescape")
        return None

    def dir_base(dir_fd):
        if type(dir_fd) is int and dir_fd >= 0:
            try:
                return readlink("/proc/self/fd/%d" % dir_fd)
            except OSError:
                return None
        return getcwd()

    def inside(path, strict):
        if path is None:
            return False
        if path == root:
            return not strict
        return path.startswith(root + "/")

    def is_proc_mem(path):
        parts = path.split("/")
        return len(parts) >= 4 and parts[1] == "proc" and parts[-1] == "mem"

    def refuse(event, what):
        if state["violation"] is None:
            state["violation"] = ("%s %s" % (event, what))[:300]
        raise PermissionError("sandbox: %s refused (%s)" % (event, what[:200]))

    def check_path(event, p, dir_fd, strict):
        if type(p) is int:  # an open descriptor: where does it point?
            try:
                target = readlink("/proc/self/fd/%d" % p)
            except OSError:
                refuse(event, "fd %d" % p)
            if not inside(target, strict):
                refuse(event, "fd %d -> %r" % (p, target[:100]))
            return
        s = as_str(p)
        if s is None:
            refuse(event, "path of type %s" % type(p).__name__)
        base = dir_base(dir_fd)
        if base is None or not inside(resolve(s, base), strict):
            refuse(event, repr(s[:150]))

    def hook(event, args):
        if event == "pvf_sandbox.report":
            if getframe(1) is not state["frame"] or state["reported"]:
                refuse(event, "not from the runner")
            state["reported"] = True
            status, detail = args
            if type(status) is not str or status not in ("passed", "failed"):
                status, detail = "error", "bad report"
            if type(detail) is not str:
                detail = ""
            if state["violation"] is not None:
                status, detail = "error", "sandbox refused: " + state["violation"]
            line = nonce + "\t" + status + "\t" + detail.replace("\n", " ")[:2000] + "\n"
            write(report_fd, line.encode("utf-8", "replace"))
            return
        if event == "open":
            p, mode, flags = args
            if type(p) is int:
                return
            s = as_str(p)
            if s is None:
                refuse(event, "path of type %s" % type(p).__name__)
            if type(flags) is int and flags & WRITE_FLAGS:
                if s == "/dev/null":
                    return
                cwd = getcwd()
                if not inside(resolve(s, cwd), True):
                    refuse("open for writing", repr(s[:150]))
                return
            try:
                is_dir = S_ISDIR(stat_(s).st_mode)
            except OSError:
                is_dir = False
            if is_dir or "mem" in s:
                r = resolve(s, getcwd())
                if r is None or is_proc_mem(r) or (is_dir and not inside(r, False)):
                    refuse(event, repr(s[:150]))
            return
        if event in REFUSE or (event.startswith(REFUSE_PREFIX) and event != "ctypes.dlopen"):
            refuse(event, "")
        spec = PATH_EVENTS.get(event)
        if spec is not None:
            positions, dfd = spec
            dir_fd = args[dfd] if dfd is not None and dfd < len(args) else None
            strict = event != "os.mkdir"
            for i in positions:
                if i < len(args):
                    check_path(event, args[i], dir_fd, strict)

    def arm(frame):
        state["frame"] = frame
        addaudithook(hook)

    return arm


def _run(box):
    code, arm = box.pop()
    arm(sys._getframe())
    del arm
    audit = sys.audit
    exit_ = os._exit
    g = {}
    try:
        exec(code, g)
    except BaseException as e:
        status = "failed"
        try:
            detail = "%s: %s" % (type(e).__name__, e)
        except BaseException:
            detail = "unprintable exception"
    else:
        status = "passed"
        detail = ""
    try:
        audit("pvf_sandbox.report", status, detail)
    finally:
        exit_(0)


def _entry():
    box = [_setup()]
    _run(box)


_entry()
'''

_PRELOAD = ("typing", "math", "hashlib", "re", "collections", "itertools", "functools", "string",
            "heapq", "bisect", "random", "statistics", "fractions", "decimal", "operator",
            "copy", "datetime", "json", "array", "numbers", "cmath")

RUNNER_SOURCE = (f"JOB = {JOB_FILE!r}\nPRELOAD = {_PRELOAD!r}\n" + _RUNNER)


def _world_traversable(path: str) -> bool:
    """Can an unprivileged user reach ``path`` (every ancestor o+x)?"""
    p = os.path.realpath(path)
    while True:
        try:
            if not os.stat(p).st_mode & 0o001:
                return False
        except OSError:
            return False
        parent = os.path.dirname(p)
        if parent == p:
            return True
        p = parent


def _sandbox_base(dropping: bool) -> str | None:
    base = tempfile.gettempdir()
    if dropping and not _world_traversable(base):
        return "/tmp"
    return base


class SandboxError(RuntimeError):
    """The sandbox could not be set up (e.g. the privilege drop failed): nothing was run, and
    scoring the program 0 would blame the model for the machine."""


def _parse_report(data: bytes, nonce: str) -> dict:
    """``{status: detail}`` of the runner's lines (``setup``, ``started``, then one of
    ``passed``/``failed``/``error``); lines without the nonce are ignored."""
    out = {}
    for raw in data.decode("utf-8", "replace").splitlines():
        parts = raw.split("\t", 2)
        if len(parts) >= 2 and parts[0] == nonce and parts[1] not in out:
            out[parts[1]] = parts[2] if len(parts) > 2 else ""
    return out


def _read_all(fd: int) -> bytes:
    chunks, total = [], 0
    os.set_blocking(fd, False)
    while total < _READ_LIMIT:
        try:
            b = os.read(fd, _READ_LIMIT - total)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
        total += len(b)
    return b"".join(chunks)


def run_program(program: str, *, timeout: float = 3.0, wall_timeout: float | None = None,
                memory_mb: int = 1024, fsize_mb: int = 16, uid: int = NOBODY,
                gid: int = NOBODY) -> ExecResult:
    """Run ``program`` in a sandboxed child process (see the module docstring).

    ``timeout`` is CPU seconds (RLIMIT_CPU, rounded up; load on the machine does not eat
    into it); ``wall_timeout`` (default ``2 * timeout + 5``) also bounds programs that sleep
    or block. ``uid``/``gid`` are used only when running as root.
    """
    t0 = time.monotonic()
    cpu_s = max(1, math.ceil(timeout))
    wall = float(wall_timeout) if wall_timeout is not None else 2.0 * cpu_s + 5.0
    dropping = os.geteuid() == 0
    workdir = tempfile.mkdtemp(prefix="pvf_sandbox_", dir=_sandbox_base(dropping))
    r_fd = w_fd = None
    err = None
    nonce = secrets.token_hex(16)

    def result(passed: bool, reason: str, detail: str = "") -> ExecResult:
        return ExecResult(passed, reason, detail.replace("\n", " ").strip()[:2000],
                          time.monotonic() - t0)

    try:
        if dropping:
            os.chown(workdir, uid, gid)
        r_fd, w_fd = os.pipe()
        job = {"program": program, "nonce": nonce, "report_fd": w_fd, "cpu_s": cpu_s,
               "memory_bytes": int(memory_mb) << 20, "fsize_bytes": int(fsize_mb) << 20,
               "uid": uid, "gid": gid}
        job_path = os.path.join(workdir, JOB_FILE)
        fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(job).encode("utf-8"))
        err = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", RUNNER_SOURCE, workdir],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                cwd=workdir, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                pass_fds=(w_fd,), start_new_session=True)
        except OSError as e:
            return result(False, "error", f"could not start the sandbox: {e}")
        os.close(w_fd)
        w_fd = None
        timed_out = False
        try:
            proc.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        report = _parse_report(_read_all(r_fd), nonce)
        if "setup" in report:
            raise SandboxError(f"pvf_lmeval.code_exec: the sandbox could not be set up: "
                               f"{report['setup']}")
        for reason in ("passed", "failed", "error"):
            if reason in report:
                return result(reason == "passed", reason, report[reason])
        if timed_out:
            return result(False, "timeout", f"wall-clock limit of {wall:g} s")
        rc = proc.returncode
        err.seek(0)
        tail = err.read()[-_READ_LIMIT:].decode("utf-8", "replace").strip().splitlines()
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        if "started" not in report:
            raise SandboxError(f"pvf_lmeval.code_exec: the sandbox process ended before the "
                               f"program started ({how})" + (f": {tail[-1]}" if tail else ""))
        if rc in (-signal.SIGXCPU, -signal.SIGKILL):
            return result(False, "timeout", f"CPU limit of {cpu_s} s (signal {-rc})")
        return result(False, "error", f"ended without a report ({how})"
                      + (f": {tail[-1]}" if tail else ""))
    finally:
        for fd in (r_fd, w_fd):
            if fd is not None:
                os.close(fd)
        if err is not None:
            err.close()
        shutil.rmtree(workdir, ignore_errors=True)


def default_workers() -> int:
    """A small pool: at most 4, at most the CPUs this process may use."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(4, n))


def run_programs(programs, *, workers: int | None = None, **limits) -> list[ExecResult]:
    """:func:`run_program` over many programs, ``workers`` children at a time, in order."""
    programs = list(programs)
    workers = workers or default_workers()
    if workers <= 1 or len(programs) <= 1:
        return [run_program(p, **limits) for p in programs]
    with ThreadPoolExecutor(max_workers=min(workers, len(programs))) as pool:
        return list(pool.map(lambda p: run_program(p, **limits), programs))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k).

    Computed as in Chen et al. (2021), ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``. ``k > n`` is
    undefined (ValueError).
    """
    n, c, k = int(n), int(c), int(k)
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1 (n={n}, c={c}, k={k})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod
