"""Where the task YAMLs and planning-vocabulary artifacts live, and where the user's own go.

In a source checkout or an editable install (``pip install -e .``) these are the repo's
top-level ``tasks/`` and ``vocab_artifacts/`` folders; a normal install carries copies
inside the package (``pvf_lmeval/_tasks``, ``pvf_lmeval/_vocab_artifacts``, see the
wheel's force-include table in pyproject.toml).

``pvf-tasks-path`` prints the tasks folder, for ``lm_eval --include_path "$(pvf-tasks-path)"``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the user's folder for files pvf-lmeval writes on its own (calibrated artifacts)
HOME_ENV = "PVF_LMEVAL_HOME"

#: the installed package (``pvf_lmeval/``), this module's parent's parent
_PKG = Path(__file__).resolve().parent.parent


def _find(packaged: str, top_level: str) -> Path:
    candidate = _PKG / packaged
    if candidate.is_dir():  # normal install
        return candidate
    repo = _PKG.parent
    if (repo / "pyproject.toml").is_file() and (repo / top_level).is_dir():  # checkout
        return repo / top_level
    raise FileNotFoundError(
        f"neither {candidate} (installed package) nor {repo / top_level} (source checkout) "
        "exists"
    )


def tasks_dir() -> Path:
    """The folder of task YAMLs (pass it to ``lm_eval --include_path``)."""
    return _find("_tasks", "tasks")


def vocab_artifacts_dir() -> Path:
    """The folder of planning-vocabulary JSON artifacts."""
    return _find("_vocab_artifacts", "vocab_artifacts")


def user_home() -> Path:
    """``$PVF_LMEVAL_HOME``, else ``$XDG_CACHE_HOME/pvf_lmeval``, else ``~/.cache/pvf_lmeval``:
    the user's folder for what pvf-lmeval writes by default. Never inside the package."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache) / "pvf_lmeval"


def user_vocab_dir() -> Path:
    """Where ``pvf-calibrate`` writes artifacts without ``--out`` (``user_home()/vocab``);
    ``vocab=auto`` and artifact names look here as well as in :func:`vocab_artifacts_dir`."""
    return user_home() / "vocab"
