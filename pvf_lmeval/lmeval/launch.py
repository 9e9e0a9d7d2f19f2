"""How the plugin sits in an lm-eval process: ranks the launcher asked for, lm-eval's git probe.

Data parallel runs that work (each rank takes every world_size-th document):

* CPU or GPU: ``torchrun --nproc_per_node N -m lm_eval --model pvf-dlm ...``
* GPU, or CPU as well: ``accelerate launch --multi_gpu --num_processes N -m lm_eval ...``. Without
  ``--multi_gpu`` (or a saved ``accelerate config``) accelerate starts a *single* process on a
  machine without GPUs, which evaluates everything alone; :func:`single_rank_warning` says so.
"""

from __future__ import annotations

import os
import re
import subprocess

_NUM_PROCESSES = re.compile(r"^--num[_-]processes(?:=(\d+))?$")


def _parent_cmdline(pid: int | None = None) -> list[str]:
    """The parent process's argv (Linux ``/proc``; empty elsewhere or when unreadable)."""
    try:
        with open(f"/proc/{pid or os.getppid()}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def requested_processes(argv: list[str]) -> int | None:
    """N of an ``accelerate launch ... --num_processes N`` command line, else None."""
    if "launch" not in argv or not any("accelerate" in os.path.basename(a) for a in argv[:3]):
        return None
    for i, arg in enumerate(argv):
        m = _NUM_PROCESSES.match(arg)
        if m:
            value = m.group(1) or (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() else None
    return None


def single_rank_warning(world_size: int, parent_argv: list[str] | None = None) -> str | None:
    """A one-line warning when ``accelerate launch`` asked for several processes but this run
    has a single rank; None otherwise."""
    if world_size > 1:
        return None
    asked = requested_processes(_parent_cmdline() if parent_argv is None else parent_argv)
    if not asked or asked < 2:
        return None
    return (f"pvf-dlm: accelerate launch asked for {asked} processes but this run has 1 rank and "
            "evaluates every document alone (without GPUs accelerate starts one process unless "
            f"--multi_gpu is given); use accelerate launch --multi_gpu --num_processes {asked} "
            f"or torchrun --nproc_per_node {asked} -m lm_eval ...")


def _git_commit_hash():
    """lm-eval's ``get_git_commit_hash`` without git's "fatal: not a git repository" on stderr
    when the run starts outside a git checkout (same result otherwise)."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        out = subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL)
        return out.strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


def quiet_git_probe() -> None:
    """Make lm-eval's evaluator record the git hash without writing git's error to the terminal."""
    import lm_eval.evaluator as evaluator

    evaluator.get_git_commit_hash = _git_commit_hash
