"""The suite's own home, and fixtures shared by the test files that run the bundled tiny models.

The suite runs in a home of its own: before anything is imported, ``HOME`` and the XDG folders
point into a fresh temporary folder (removed at exit), and the variables that name the user's
pvf-lmeval, data and Hugging Face folders are dropped, so ``~/.cache/pvf_lmeval`` (calibrated
vocabularies, ``pvf-data`` copies), ``$HF_HOME`` and the like resolve inside it. Nothing the user
keeps there changes a result, and nothing the suite writes lands there; the `lm_eval` and
console-tool processes the tests start inherit it (tests/test_suite_home.py plants hostile files
in a home and runs tests under it).

``tests/`` is on ``sys.path`` (pytest's rootdir-relative imports), so the test files import their
helpers as ``from helpers.x import ...``; ``bench/`` is put there too, for the tests of the
benchmark scripts and of ``bench/benchlib.py``'s one-request cache."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: where the user's own files would be read from or written to, were they not redirected
USER_FOLDER_VARIABLES = ("PVF_LMEVAL_HOME", "PVF_DATA_DIR", "HF_HOME", "HF_DATASETS_CACHE",
                         "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE",
                         "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "MPLCONFIGDIR")


def _suite_home() -> Path:
    """A fresh home for this run of the suite (see the module docstring)."""
    root = Path(tempfile.mkdtemp(prefix="pvf-suite-"))
    atexit.register(shutil.rmtree, root, True)
    home = root / "home"
    for name in USER_FOLDER_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                      XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"))
    (home / ".cache").mkdir(parents=True)
    return home


SUITE_HOME = _suite_home()

import pytest  # noqa: E402
import torch  # noqa: E402  (libraries that read the home at import come after it is set)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from pvf_lmeval.models import load_model  # noqa: E402


@pytest.fixture(autouse=True)
def lm_evals_default_torch_seed():
    """Every test starts from the torch seed lm-eval's runs start from (``--seed``'s default,
    1234 for torch): the adapter without a ``seed`` model arg draws from it (its sampling, the
    likelihood's masks), so a test's draws do not depend on the tests that ran before it."""
    torch.manual_seed(1234)


@pytest.fixture(scope="module")
def one_thread():
    """Small CPU forwards: one torch thread is several times faster than two on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llada():
    return load_model("tiny-llada")
