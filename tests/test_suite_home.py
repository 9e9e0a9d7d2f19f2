"""The suite runs in a home of its own (tests/conftest.py): what the user keeps in theirs (a
calibrated planning vocabulary, ``pvf-data`` copies, a Hugging Face cache) changes no result,
and nothing the suite writes lands there.

The attack: a home full of hostile files (an artifact that shadows a bundled vocabulary, a
second one that ``pvf-dlm vocab`` would list, a corrupt HumanEval copy, junk in the Hugging Face
cache), named by every variable that points at it, and tests run under it that read those
folders (the vocabulary listing that failed for a user who had calibrated a vocabulary) and
write to them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

from conftest import SUITE_HOME

REPO = Path(__file__).resolve().parents[1]


def _inside(path: Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def test_defaults_resolve_inside_the_suite_home():
    """Every default folder the package reads or writes lies in the suite's home, not in the
    account's; what ``pvf-calibrate`` writes without ``--out`` lands there."""
    from pvf_lmeval.cli.calibrate import default_out
    from pvf_lmeval.data import data_dir
    from pvf_lmeval.data.hub_cache import datasets_cache
    from pvf_lmeval.files.paths import user_home, user_vocab_dir

    account_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    folders = [Path.home(), user_home(), user_vocab_dir(), data_dir(), datasets_cache()]
    for folder in folders:
        assert _inside(folder, SUITE_HOME) and not _inside(folder, account_home), folder
    out = default_out("tiny-llada", "math-word")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("{}")
    assert _inside(out, SUITE_HOME)


def _snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` with a digest of its content ("dir" for folders)."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else
            hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))}


def _hostile_home(home: Path) -> dict[str, str]:
    """A home whose files would change the suite's results if it read them; the environment
    variables that name its folders."""
    bundled = json.loads((REPO / "vocab_artifacts/tiny-llada.math-word.calibrated.json").read_text())
    shadow = dict(bundled, tokens=bundled["tokens"][:1], model="a user's calibration")
    vocab = home / ".cache/pvf_lmeval/vocab"
    vocab.mkdir(parents=True)
    (vocab / "tiny-llada.math-word.calibrated.json").write_text(json.dumps(shadow))
    (vocab / "mine.math-word.calibrated.json").write_text(json.dumps(shadow))
    data = home / ".cache/pvf_lmeval/data/humaneval"
    data.mkdir(parents=True)
    (data / "HumanEval.jsonl.gz").write_bytes(b"not gzip")
    hf = home / ".cache/huggingface/datasets"
    hf.mkdir(parents=True)
    (hf / "junk.lock").write_text("held")
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "PVF_LMEVAL_HOME": str(home / ".cache/pvf_lmeval"),
            "PVF_DATA_DIR": str(home / ".cache/pvf_lmeval/data"),
            "HF_HOME": str(home / ".cache/huggingface")}


def test_a_hostile_home_changes_no_result_and_receives_nothing(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, **_hostile_home(home)}
    before = _snapshot(home)
    tests = ["tests/test_dlm_cli.py::test_vocab_lists_every_bundled_artifact",
             "tests/test_vocab.py::test_auto_picks_the_fixture_artifact",
             "tests/test_suite_home.py::test_defaults_resolve_inside_the_suite_home"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                           "-p", "no:cacheprovider", *tests], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout
    assert _snapshot(home) == before
