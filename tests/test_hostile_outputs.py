"""Hostile and broken outputs: writes that follow planted links or race, traces that are torn,
duplicated or crafted, terminal control sequences in model text."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from pvf_lmeval import atomic
from pvf_lmeval.planning import calibrate, vocab

ART = {"format_version": 1, "kind": "hand-written", "model_family": "llada",
       "task_family": "math-word", "model": "m", "tokens": [{"id": 1, "string": "a"}]}


def _writers():
    """Every writer of a whole JSON output file, as (name, write(path, data))."""
    return [("atomic.write_json", atomic.write_json),
            ("calibrate._write_json", calibrate._write_json),
            ("vocab.save_artifact", lambda p, d: vocab.save_artifact(d, p))]


@pytest.mark.parametrize("name,write", _writers(), ids=[n for n, _ in _writers()])
def test_a_link_planted_at_a_temporary_name_is_not_followed(tmp_path, name, write):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out.json"
    for planted in (out.with_name(out.name + ".tmp"), out.with_name(out.name + ".part")):
        planted.symlink_to(victim)
    write(out, ART)
    assert victim.read_text() == "precious\n"
    assert json.loads(out.read_text())["tokens"] == [{"id": 1, "string": "a"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "out.json.part",
                                                          "out.json.tmp", "victim.txt"]


def test_a_link_at_the_target_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out.json"
    out.symlink_to(victim)
    atomic.write_json(out, {"a": 1})
    assert victim.read_text() == "precious\n"
    assert not out.is_symlink() and json.loads(out.read_text()) == {"a": 1}


def _hammer(args):
    path, k, n = args
    failures = 0
    for i in range(n):
        try:
            calibrate._write_json(Path(path), {"writer": k, "i": i, "pad": "x" * 4096})
        except OSError:
            failures += 1
    return failures


def test_concurrent_writers_of_one_output_all_succeed(tmp_path):
    out = tmp_path / "out.json"
    with multiprocessing.get_context("fork").Pool(2) as pool:
        failures = pool.map(_hammer, [(str(out), 0, 150), (str(out), 1, 150)])
    assert failures == [0, 0]
    last = json.loads(out.read_text())
    assert last["i"] == 149 and last["pad"] == "x" * 4096
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "out.json"
    out.write_text('{"old": true}\n')
    with pytest.raises(TypeError):
        atomic.write_json(out, {"bad": object()})
    assert out.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_write_bytes_fsyncs_the_file_and_its_folder(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    atomic.write_text(tmp_path / "a.txt", "x")
    assert len(synced) == 2
    assert synced[0].startswith(str(tmp_path / ".a.txt.")) and synced[1] == str(tmp_path)
