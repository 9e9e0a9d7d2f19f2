"""Host side: check one candidate program against a problem's test, in two sandboxes.

:func:`check_candidate` (HumanEval: ``check(entry_point)``) and :func:`check_asserts` (MBPP:
a problem's ``assert`` lines against the program's top-level names) start two isolated
processes (:mod:`.bubblewrap`) running :mod:`.inside`: the *candidate* (the model's program)
and the *checker* (the dataset's code, trusted), joined by two pipes that carry only plain
literals (:mod:`.literals`). The verdict comes from the checker alone, on a third pipe that
only it holds: **passed** means the checker's test returned normally and its process exited 0
within the wall-clock limit. Nothing the candidate does can write that verdict.

:class:`ExecResult` ``reason`` is one of :data:`REASONS`:

- ``passed``;
- ``failed``: the check raised (a wrong answer, an exception of the candidate's), the
  candidate's process exited while it was being checked, or the checker program itself failed
  on what the candidate sent;
- ``syntax``: the program does not compile;
- ``timeout``: the CPU-time limit (RLIMIT_CPU, of either process) or the wall-clock limit;
- ``memory``: a MemoryError (the address-space limit, RLIMIT_AS) decided the check;
- ``signal``: the candidate's process was killed by a signal other than the CPU limit's;
- ``unchecked`` (:func:`check_asserts` only): the check needed a value that cannot cross as
  plain data (an object passed to the program or returned by it, a global of the program's
  that is no function, plain value or standard-library module): not passed, and counted
  apart, since running both in one namespace might have passed it.

:class:`SandboxError` is raised, instead of a score, when the sandbox cannot be started or
the problem cannot be checked across processes (a HumanEval test that passes the candidate
something that is not plain data, a test that does not run): that is the machine's or the
dataset's fault, not the model's. :class:`~.bubblewrap.IsolationUnavailable` (a
SandboxError) when no isolation is available.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import os
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import literals
from .bubblewrap import Isolation, SandboxError, isolation, seccomp_fd

__all__ = ["ExecResult", "SandboxError", "REASONS", "assert_names", "check_asserts",
           "check_candidate", "check_candidates", "default_workers"]

REASONS = ("passed", "failed", "syntax", "timeout", "memory", "signal", "unchecked")
#: files (inodes) a sandboxed process may create in its /tmp: a few hundred bytes of kernel
#: memory each, which the tmpfs's size does not count
TMPFS_INODES = 4096
#: bytes of bwrap's stderr kept for a setup error
_ERR_LIMIT = 4096


@dataclass(frozen=True)
class ExecResult:
    """Outcome of checking one candidate."""

    passed: bool
    reason: str          # one of REASONS
    detail: str = ""     # one line: the exception, the limit, the signal
    wall_s: float = 0.0


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_available(fd: int, limit: int) -> bytes:
    os.set_blocking(fd, False)
    chunks, total = [], 0
    while total < limit:
        try:
            b = os.read(fd, limit - total)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
        total += len(b)
    return b"".join(chunks)


def _status(data: bytes) -> dict:
    """bwrap's --json-status-fd documents, merged (``child-pid``, then ``exit-code``)."""
    out: dict = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.update(doc)
    return out


class _Sandboxed:
    """One process started in the sandbox: its Popen, status pipe and stderr."""

    def __init__(self, iso: Isolation, role: str, job: dict, fds: list[int], tmpfs_bytes: int):
        job_fd = _memfd(f"pvf-{role}-job", json.dumps(job).encode("utf-8"))
        self.status_r, status_w = os.pipe() if iso.bwrap else (None, None)
        filter_fd = seccomp_fd() if iso.bwrap else None
        argv = [iso.python, "-I", "-S", "-B", iso.inside_script, role, str(job_fd)] + \
            [str(f) for f in fds]
        cmd = iso.command(argv, tmpfs_bytes=tmpfs_bytes, seccomp_fd=filter_fd,
                          status_fd=status_w)
        keep = [job_fd] + fds + [f for f in (status_w, filter_fd) if f is not None]
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, pass_fds=keep, start_new_session=True,
                cwd="/" if iso.bwrap else tempfile.gettempdir(),
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        except OSError as e:
            raise SandboxError(f"pvf_lmeval.sandbox: could not start {cmd[0]}: {e}") from None
        finally:
            for fd in (job_fd, status_w, filter_fd):
                if fd is not None:
                    os.close(fd)

    def wait(self, timeout: float | None) -> bool:
        """True if it ended within ``timeout`` seconds."""
        try:
            self.proc.wait(timeout=max(0.0, timeout) if timeout is not None else None)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def finish(self) -> tuple[dict, str]:
        """(bwrap's status, the tail of its stderr), once the process has ended."""
        status = {}
        if self.status_r is not None:
            status = _status(_read_available(self.status_r, 1 << 16))
        err = _read_available(self.proc.stderr.fileno(), 1 << 20)[-_ERR_LIMIT:]
        self.close()
        return status, " ".join(err.decode("utf-8", "replace").split())[-500:]

    def close(self) -> None:
        """Kill it if it still runs; close our ends of its pipes."""
        if self.proc.poll() is None:
            self.kill()
        if self.status_r is not None:
            os.close(self.status_r)
            self.status_r = None
        self.proc.stderr.close()

    def exit_code(self, status: dict) -> int | None:
        """The sandboxed program's exit code (bwrap reports 128 + N for signal N)."""
        if "exit-code" in status:
            return int(status["exit-code"])
        rc = self.proc.returncode
        if rc is None:
            return None
        return 128 - rc if rc < 0 else rc


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def check_candidate(program: str, *, prompt: str, test: str, entry_point: str,
                    timeout: float = 3.0, wall_timeout: float | None = None,
                    memory_mb: int = 1024, fsize_mb: int = 16, tmpfs_mb: int = 64
                    ) -> ExecResult:
    """Check ``program`` (prompt + completion) with ``test``'s ``check(entry_point)``.

    ``timeout`` is CPU seconds per process (RLIMIT_CPU, rounded up; load on the machine
    does not eat into it); ``wall_timeout`` (default ``2 * timeout + 5``) bounds the whole
    check, programs that sleep or block included. ``memory_mb`` is each process's address
    space, ``fsize_mb`` the largest file it may write, ``tmpfs_mb`` the size of its /tmp.
    """
    return _check({"program": program, "entry_point": entry_point},
                  {"prompt": prompt, "test": test, "entry_point": entry_point},
                  timeout=timeout, wall_timeout=wall_timeout, memory_mb=memory_mb,
                  fsize_mb=fsize_mb, tmpfs_mb=tmpfs_mb)


def assert_names(asserts, setup: str = "") -> list[str]:
    """The names ``asserts`` read that neither ``setup`` binds nor Python builtins name: those
    the candidate's program must define. :class:`SandboxError` if the code does not parse."""
    try:
        trees = [ast.parse(setup)] + [ast.parse(a) for a in asserts]
    except (SyntaxError, ValueError) as e:
        raise SandboxError(f"pvf_lmeval.sandbox: this problem's test does not parse: "
                           f"{type(e).__name__}: {e}") from None
    bound = set(dir(builtins))
    for node in ast.walk(trees[0]):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names)
    used = {node.id for tree in trees[1:] for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return sorted(used - bound)


def check_asserts(program: str, *, asserts, setup: str = "", timeout: float = 3.0,
                  wall_timeout: float | None = None, memory_mb: int = 1024, fsize_mb: int = 16,
                  tmpfs_mb: int = 64) -> ExecResult:
    """Check ``program`` with a problem's ``assert`` lines (MBPP's ``test_list``), run after
    ``setup`` (its ``test_setup_code``) in the checker, one by one.

    The names the asserts read (:func:`assert_names`) resolve, in the checker, to what the
    program's globals hold under them, as plain data: a function or class to a proxy that
    calls it in the candidate's process with literal arguments and returns a literal, a
    plain-data value to its literal, a standard-library module to the checker's own import;
    builtins are the checker's own, whatever the program defines. A check that needs a value
    that cannot cross (an instance passed in or returned) is reason ``unchecked``, never a
    pass; a problem without asserts is a :class:`SandboxError`. Limits as
    :func:`check_candidate`.
    """
    asserts = [str(a) for a in asserts]
    if not asserts:     # nothing to check: any program that loads would pass
        raise SandboxError("pvf_lmeval.sandbox: this problem has no assert lines to check")
    names = assert_names(asserts, setup)
    return _check({"program": program, "names": names},
                  {"setup": setup, "asserts": asserts, "names": names},
                  timeout=timeout, wall_timeout=wall_timeout, memory_mb=memory_mb,
                  fsize_mb=fsize_mb, tmpfs_mb=tmpfs_mb)


def _check(cand_job: dict, chk_job: dict, *, timeout: float, wall_timeout: float | None,
           memory_mb: int, fsize_mb: int, tmpfs_mb: int) -> ExecResult:
    """The candidate's job and the checker's in two sandboxes; the verdict from the checker."""
    t0 = time.monotonic()
    iso = isolation()
    cpu_s = max(1, math.ceil(timeout))
    wall = float(wall_timeout) if wall_timeout is not None else 2.0 * cpu_s + 5.0
    limits = {"cpu_s": cpu_s, "memory_bytes": int(memory_mb) << 20,
              "fsize_bytes": int(fsize_mb) << 20, "nofile": 64, "nproc": 0}
    tmpfs = int(tmpfs_mb) << 20
    if iso.bwrap:       # inside.py's own /tmp: bytes and files (the inodes' kernel memory)
        limits.update(tmpfs_bytes=tmpfs, tmpfs_inodes=TMPFS_INODES)

    def result(reason: str, detail: str = "") -> ExecResult:
        return ExecResult(reason == "passed", reason, " ".join(detail.split())[:2000],
                          time.monotonic() - t0)

    to_cand_r, to_cand_w = os.pipe()     # checker -> candidate: calls
    to_chk_r, to_chk_w = os.pipe()       # candidate -> checker: greeting, answers
    verdict_r, verdict_w = os.pipe()     # checker -> here
    ours = [to_cand_r, to_cand_w, to_chk_r, to_chk_w, verdict_r, verdict_w]
    started: list[_Sandboxed] = []
    try:
        cand = _Sandboxed(iso, "candidate", {**cand_job, "limits": limits},
                          [to_cand_r, to_chk_w], tmpfs)
        started.append(cand)
        chk = _Sandboxed(iso, "checker", {**chk_job, "limits": limits},
                         [to_chk_r, to_cand_w, verdict_w], tmpfs)
        started.append(chk)
        for fd in (to_cand_r, to_cand_w, to_chk_r, to_chk_w, verdict_w):
            os.close(fd)
            ours.remove(fd)
        in_time = chk.wait(t0 + wall - time.monotonic())
        if not in_time:
            for p in started:
                p.kill()
            return result("timeout", f"wall-clock limit of {wall:g} s")
        verdict_raw = _read_available(verdict_r, literals.MAX_FRAME + 4)
        # the candidate sees EOF once the checker is gone; give it a moment, then kill it
        if not cand.wait(min(1.0, max(0.0, t0 + wall - time.monotonic()))):
            cand.kill()
        chk_status, chk_err = chk.finish()
        cand_status, cand_err = cand.finish()
        for who, status, err in (("checker", chk_status, chk_err),
                                 ("candidate", cand_status, cand_err)):
            if iso.bwrap and "child-pid" not in status:
                raise SandboxError(f"pvf_lmeval.sandbox: the {who}'s sandbox did not start: "
                                   f"{err or 'no message'}")
        return _classify(verdict_raw, chk.exit_code(chk_status), cand.exit_code(cand_status),
                         cpu_s, result)
    finally:
        for p in started:
            p.close()
        for fd in ours:
            os.close(fd)


def _classify(verdict_raw: bytes, chk_rc, cand_rc, cpu_s: int, result) -> ExecResult:
    try:
        size = int.from_bytes(verdict_raw[:4], "big")
        verdict = ast.literal_eval(verdict_raw[4:4 + size].decode("ascii"))
    except (ValueError, SyntaxError, UnicodeDecodeError):
        verdict = None
    if verdict == ("passed",) and chk_rc == 0:
        return result("passed")
    if type(verdict) is tuple and len(verdict) == 2 and verdict[0] == "error":
        # the checker program itself raised: it runs on what the candidate sent, so this is a
        # failed sample with its reason, never an exception in the evaluation
        return result("failed", f"the checker failed: {verdict[1]}")
    if chk_rc == 128 + signal.SIGXCPU:
        return result("timeout", f"the checker hit the CPU limit of {cpu_s} s")
    if not (type(verdict) is tuple and len(verdict) == 3 and verdict[0] == "failed"):
        how = f"exit code {chk_rc}" if chk_rc is None or chk_rc < 128 else \
            _signal_name(chk_rc - 128)
        return result("signal" if chk_rc and chk_rc > 128 else "failed",
                      f"the checker ended without a verdict ({how})")
    _, kind, detail = verdict
    if kind == "opaque":
        return result("unchecked", detail)
    if kind == "unchecked":
        raise SandboxError(f"pvf_lmeval.sandbox: this problem cannot be checked across "
                           f"processes: {detail}")
    if kind in ("syntax", "memory", "failed"):
        return result(kind, detail)
    # kind == "ended": the candidate's process went away mid-check; its status says why
    if cand_rc == 128 + signal.SIGXCPU:
        return result("timeout", f"CPU limit of {cpu_s} s")
    if cand_rc is not None and cand_rc > 128:
        why = " (the CPU limit's hard stop, if it ignored SIGXCPU)" \
            if cand_rc == 128 + signal.SIGKILL else ""
        return result("signal", f"the candidate's process was killed by "
                                f"{_signal_name(cand_rc - 128)}{why}")
    return result("failed", f"{detail} (exit code {cand_rc})")


def default_workers() -> int:
    """A small pool: at most 4, at most the CPUs this process may use."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(4, n))


def check_candidates(jobs, *, workers: int | None = None, **limits) -> list[ExecResult]:
    """:func:`check_candidate` over many jobs (dicts of its keyword arguments, ``program``
    included; a job with ``asserts`` is :func:`check_asserts`'s), ``workers`` at a time,
    results in order."""
    jobs = [dict(j) for j in jobs]
    if jobs:
        isolation()  # refuse once, before starting anything
    workers = workers or default_workers()

    def one(job):
        check = check_asserts if "asserts" in job else check_candidate
        return check(job.pop("program"), **job, **limits)

    if workers <= 1 or len(jobs) <= 1:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(one, jobs))
