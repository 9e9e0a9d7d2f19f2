"""Which environment ``make demo`` / ``make test`` run in (Makefile, scripts/active_env.py).

Each test copies the Makefile, the probe and the install inputs into a temporary checkout, builds
a minimal environment there (``python -m venv --without-pip`` plus hand-written ``.dist-info``
folders: an editable install of that checkout, its requirements at chosen versions) and runs
real ``make`` processes with that environment first on PATH, as an activated venv or conda
environment puts it: ``make -n`` for the commands a goal would run, ``make`` itself where the goal
must stop before running anything. No package is installed and nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import packaging
import pytest

REPO = Path(__file__).resolve().parents[1]
PY_VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
#: the Makefile's INSTALL_INPUTS and the probe: what the copied checkout needs
CHECKOUT_FILES = ("Makefile", "scripts/active_env.py", "pyproject.toml", "pvf_lmeval/__init__.py",
                  "pvf_lmeval/_site_hook/pvf_lmeval_hook.py",
                  "pvf_lmeval/_site_hook/pvf_lmeval_hook.pth",
                  "pvf_lmeval/_site_hook/hatch_build.py")
#: the package's requirements in the fake environment, as an install's METADATA spells them: one
#: of its own, one per extra, a version range, and one whose marker never holds here
REQUIRES = ("lm-eval<0.5,>=0.4.13", "pytest; extra == \"test\"",
            "pytest-xdist>=3.5; extra == \"test\"", "transformers<6,>=5; extra == \"test\"",
            "triton; platform_system == \"NoSuchSystem\" and extra == \"test\"",
            "matplotlib; extra == \"plot\"")
ALL_DEPS = {"lm-eval": "0.4.13", "pytest": "8.3.0", "pytest-xdist": "3.6.1",
            "transformers": "5.25.0", "matplotlib": "3.9.2"}
#: make's own variables in the environment would reach the copied Makefile
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON", "VENV", "USE_VENV", "VIRTUAL_ENV",
                  "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "checkout"
    for name in CHECKOUT_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    return root


def _dist_info(site: Path, name: str, version: str, requires=(), editable_from: Path | None = None):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if editable_from is not None:
        (info / "direct_url.json").write_text(json.dumps(
            {"dir_info": {"editable": True}, "url": editable_from.as_uri()}))


def make_env(root: Path, *, editable_from: Path | None, deps: dict[str, str]) -> Path:
    """A venv at ``root`` with pvf-lmeval installed editable from ``editable_from`` (None: not at
    all): its path entry, its hook module, its metadata; and ``deps`` at those versions."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = root / "lib" / PY_VERSION / "site-packages"
    # the probe reads requirements with packaging, which transformers brings to a real install
    (site / "packaging").symlink_to(Path(packaging.__file__).parent)
    if editable_from is not None:
        (site / "_pvf_lmeval_editable.pth").write_text(f"{editable_from}\n")
        # written now, as an install writes it: newer than every install input
        shutil.copyfile(editable_from / "pvf_lmeval/_site_hook/pvf_lmeval_hook.py",
                        site / "pvf_lmeval_hook.py")
        _dist_info(site, "pvf-lmeval", "0.1.0", REQUIRES, editable_from)
    for name, version in deps.items():
        _dist_info(site, name, version)
    return root


def run_make(checkout: Path, env: Path, *args: str,
             **variables: str) -> subprocess.CompletedProcess:
    """``make ARGS`` in ``checkout`` with ``env`` activated (first on PATH, VIRTUAL_ENV) and
    ``variables`` in the environment."""
    environ = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES} | variables
    environ.update(PATH=f"{env / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(env),
                   # a goal that wrongly builds .venv fails at once, offline, downloading nothing
                   PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)
    return subprocess.run(["make", "--no-print-directory", *args], cwd=checkout, env=environ,
                          capture_output=True, text=True, timeout=60)


def _probe_lines(proc) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("pvf-lmeval: ")]


def _venv_build_then(stdout: str, command: str) -> None:
    """``stdout`` (make -n) creates .venv, installs torch==2.13.0, then the package with its
    extras, and only then runs ``command`` with .venv's python."""
    lines = stdout.splitlines()

    def first(text):
        return next(i for i, ln in enumerate(lines) if text in ln)

    assert first("python3 -m venv .venv") < first('pip install "torch==2.13.0"') \
        < first('pip install -e ".[test,plot]"') < first(f'".venv/bin/python" -m {command}')


@pytest.mark.parametrize("goal, command", [("test", "pytest"), ("demo", "lm_eval")])
def test_without_an_active_install_the_goal_builds_venv_with_torch_first(checkout, tmp_path,
                                                                        goal, command):
    """A clean clone as CI runs it: the python on PATH has no pvf-lmeval, so .venv is built
    (torch==2.13.0 first) and the goal runs there; the probe says nothing."""
    env = make_env(tmp_path / "env", editable_from=None, deps={})
    proc = run_make(checkout, env, "-n", goal)
    assert proc.returncode == 0, proc.stderr
    _venv_build_then(proc.stdout, command)
    assert _probe_lines(proc) == []


def test_an_active_editable_install_runs_demo_and_test_there(checkout, tmp_path):
    env = make_env(tmp_path / "env", editable_from=checkout, deps=ALL_DEPS)
    python = env / "bin" / "python3"          # what `python3` on PATH starts
    demo = run_make(checkout, env, "-n", "demo")
    assert demo.returncode == 0, demo.stderr
    assert f'"{python}" -m lm_eval --model pvf-dlm' in demo.stdout
    assert "venv" not in demo.stdout and "pip install" not in demo.stdout
    assert _probe_lines(demo) == [f"pvf-lmeval: using the active environment, {env} (this "
                                  "checkout's editable install), not .venv"]
    test = run_make(checkout, env, "-n", "test")
    assert test.returncode == 0, test.stderr
    assert f'"{python}" -m pytest -q tests' in test.stdout and "pip install" not in test.stdout
    assert _probe_lines(test) == [f"pvf-lmeval: using the active environment, {env} (this "
                                  "checkout's editable install, with its test and plot extras), "
                                  "not .venv"]
    # USE_VENV=1 uses .venv whatever is active, without asking (and whatever the Makefile's
    # own variable names hold in the environment)
    forced = run_make(checkout, env, "-n", "test", "USE_VENV=1", ACTIVE_PY="/bin/false")
    _venv_build_then(forced.stdout, "pytest")
    assert _probe_lines(forced) == []


def test_make_test_stops_in_one_line_when_the_active_install_lacks_test_extras(checkout, tmp_path):
    """The package without pytest-xdist and with transformers 4: make test names both and runs
    nothing (no partial suite, no .venv); make demo, which needs neither, runs there."""
    deps = {**ALL_DEPS, "transformers": "4.57.1"}
    del deps["pytest-xdist"]
    env = make_env(tmp_path / "env", editable_from=checkout, deps=deps)
    proc = run_make(checkout, env, "test")
    assert proc.returncode != 0
    assert _probe_lines(proc) == [
        f"pvf-lmeval: {env / 'bin' / 'python3'} has this checkout's pvf-lmeval, but make test "
        "needs pytest-xdist (not installed), transformers 4.57.1 (needs <6,>=5): run pip install "
        "-e \".[test,plot]\" there, or USE_VENV=1 to use .venv"]
    assert "pytest" not in proc.stdout and not (checkout / ".venv").exists()
    demo = run_make(checkout, env, "-n", "demo")
    assert demo.returncode == 0 and f'"{env / "bin" / "python3"}" -m lm_eval' in demo.stdout


def test_an_install_older_than_the_install_inputs_is_refused(checkout, tmp_path):
    """pyproject.toml changed after the active environment's install: make demo asks for a fresh
    install, as the .venv's stamp would redo it, instead of running the old one."""
    env = make_env(tmp_path / "env", editable_from=checkout, deps=ALL_DEPS)
    hook = env / "lib" / PY_VERSION / "site-packages" / "pvf_lmeval_hook.py"
    installed = hook.stat().st_mtime
    os.utime(checkout / "pyproject.toml", (installed + 10, installed + 10))
    proc = run_make(checkout, env, "demo")
    assert proc.returncode != 0 and "lm_eval" not in proc.stdout
    assert _probe_lines(proc) == [
        f"pvf-lmeval: {env / 'bin' / 'python3'} has this checkout's pvf-lmeval, but make demo "
        "needs a fresh install (pyproject.toml changed since): run pip install -e . there, or "
        "USE_VENV=1 to use .venv"]


def test_another_checkouts_install_is_not_used(checkout, tmp_path):
    """The active environment's pvf-lmeval is another checkout's: .venv, with a line saying why."""
    other = tmp_path / "other"
    shutil.copytree(checkout, other)
    env = make_env(tmp_path / "env", editable_from=other, deps=ALL_DEPS)
    proc = run_make(checkout, env, "-n", "demo")
    assert proc.returncode == 0, proc.stderr
    _venv_build_then(proc.stdout, "lm_eval")
    assert _probe_lines(proc) == [
        f"pvf-lmeval: {env / 'bin' / 'python3'} has pvf-lmeval 0.1.0 as an editable install of "
        f"{other}; using .venv (pip install -e . in this checkout to use that environment "
        "instead)"]


def test_an_activated_venv_of_the_checkout_is_the_venv(checkout, tmp_path):
    """The checkout's own .venv, activated: still .venv, whose stamp keeps its install current
    (here, no stamp: make -n shows the install), and no line."""
    env = make_env(checkout / ".venv", editable_from=checkout, deps=ALL_DEPS)
    proc = run_make(checkout, env, "-n", "demo")
    assert proc.returncode == 0, proc.stderr
    assert 'pip install -e ".[test,plot]"' in proc.stdout
    assert '".venv/bin/python" -m lm_eval' in proc.stdout and _probe_lines(proc) == []
