"""How the plugin sits in an lm-eval process: its processes and model (:func:`start`), ranks the
launcher asked for, lm-eval's git probe.

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


def start(settings, notice):
    """The run's processes and its model: join the launcher's processes (the (dp, mp) mesh:
    ``Ranks``), pick this process's device (lm-eval's default CUDA device falls back to the CPU
    without a GPU, saying so), and load the model there, the batch-invariant kernels' support
    checked before any weight is read. ``notice`` prints a one-line notice."""
    import torch

    from ..models import load_model
    from ..models.loader import is_hub_id, resolve_device
    from .parallel import Ranks

    m = settings.model
    ranks = Ranks.launch(settings.parallel, m.device)
    if ranks.world > 1:
        dev = ranks.device
    elif m.cli_device and not torch.cuda.is_available():
        notice(f"pvf-dlm: no CUDA GPU; using the CPU instead of the default device {m.device!r}")
        dev = torch.device("cpu")
    else:
        dev = resolve_device(m.device)
    warning = single_rank_warning(ranks.dp_size)
    if warning:
        notice(warning)
    quiet_git_probe()
    if m.revision is not None and not is_hub_id(m.pretrained):
        notice(f"pvf-dlm: revision={m.revision} is for hub ids; pretrained={m.pretrained} is a "
               "local or bundled folder, which has no revisions (transformers ignores it there "
               "too)")
    model = load_model(m.pretrained, device=dev, dtype=m.dtype, comm=ranks.comm,
                       parallel_layers=settings.parallel.layers, revision=m.revision,
                       tokenizer=m.tokenizer, batch_invariant=settings.options.decode.batch_invariant)
    model.check_ranks = settings.parallel.check_ranks
    return ranks, model
