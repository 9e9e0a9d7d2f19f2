"""scripts/remeasure_fixture_figures.sh: which jobs it runs, with which arguments, where.

The script re-measures every README figure that depends on the fixture weights (hours of CPU),
so it is tested in its LIST=1 mode, which prints the selected jobs and runs nothing: the job
names docs/fixture-figures.md maps to README sections, the device split a GPU machine uses, and
that every job's script exists."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "remeasure_fixture_figures.sh"


def listed(tmp_path, **env) -> list[tuple[str, str, str]]:
    run_env = {k: v for k, v in os.environ.items()
               if k not in ("DEV", "ONLY", "PHASES", "PY", "DEV_BATCH", "SPLIT")}
    run_env.update(env, LIST="1")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], env=run_env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not out.exists(), "LIST=1 must not create the log folder"
    return [tuple(line.split("\t")) for line in proc.stdout.splitlines()]


def test_default_lists_every_job_once_in_three_phases(tmp_path):
    jobs = listed(tmp_path)
    names = [name for _, name, _ in jobs]
    assert len(names) == len(set(names)) == 24
    assert {phase for phase, _, _ in jobs} == {"1", "2", "3"}
    assert [n for p, n, _ in jobs if p == "1"] == ["vocab-llada", "vocab-dream", "vocab-heuristic"]
    assert [n for p, n, _ in jobs if p == "3"] == [
        "throughput-threads1", "throughput-threads2", "throughput-batch32", "e2e"]
    # on the CPU nothing names a device, and the Python is the checkout's venv
    for _, name, cmd in jobs:
        assert "--device" not in cmd, name
        if name != "demo":
            assert cmd.startswith(".venv/bin/python "), name


def test_every_job_script_exists_and_docs_name_every_log_family(tmp_path):
    jobs = listed(tmp_path)
    for _, name, cmd in jobs:
        words = shlex.split(cmd)
        scripts = [w for w in words if w.endswith(".py")]
        if name == "demo":
            assert words[:2] == ["make", "-s"]
            continue
        if "-m" in words:
            module = words[words.index("-m") + 1]
            assert (REPO / (module.replace(".", "/") + ".py")).is_file(), name
        else:
            assert scripts and (REPO / scripts[0]).is_file(), name
    docs = (REPO / "docs" / "fixture-figures.md").read_text()
    families = {re.sub(r"-(llada|dream|threads\d|batch\d+|arith|var|heuristic)(-.*)?$", "", n)
                for _, n, _ in jobs}
    for fam in families:
        assert f"`{fam}" in docs, f"docs/fixture-figures.md does not say where the {fam} logs go"


def test_gpu_split_runs_only_the_heavy_jobs_on_the_device_in_float32(tmp_path):
    jobs = listed(tmp_path, DEV="cuda", PY="python3", SPLIT="gpu")
    assert [name for _, name, _ in jobs] == [
        "vocab-llada", "vocab-dream", "decoders-var-llada", "decoders-var-dream", "vocab-modes-var"]
    for _, name, cmd in jobs:
        words = shlex.split(cmd)
        assert words[0] == "python3"
        assert words[words.index("--device") + 1] == "cuda", name
        assert words[words.index("--dtype") + 1] == "float32", name
        if name.startswith("vocab-") and name != "vocab-modes-var":
            assert words[1:3] == ["-m", "pvf_lmeval.cli.calibrate"]
            assert words[words.index("--batch-size") + 1] == "32"
        else:
            assert words[words.index("--batch-size") + 1] == "128", name


def test_phases_and_only_select(tmp_path):
    assert [n for _, n, _ in listed(tmp_path, PHASES="3", ONLY="^throughput")] == [
        "throughput-threads1", "throughput-threads2", "throughput-batch32"]
    assert listed(tmp_path, ONLY="^no-such-job$") == []
    assert {p for p, _, _ in listed(tmp_path, PHASES="2")} == {"2"}


def test_dev_batch_overrides_the_device_batch(tmp_path):
    jobs = listed(tmp_path, DEV="cuda", DEV_BATCH="64", ONLY="^decoders-var-llada$")
    words = shlex.split(jobs[0][2])
    assert words[words.index("--batch-size") + 1] == "64"


def test_the_gpu_and_cpu_splits_cover_every_job_once_and_only_narrows_them(tmp_path):
    on_gpu = [n for _, n, _ in listed(tmp_path, SPLIT="gpu")]
    on_cpu = [n for _, n, _ in listed(tmp_path, SPLIT="cpu")]
    everything = [n for _, n, _ in listed(tmp_path)]
    assert not set(on_gpu) & set(on_cpu)
    assert sorted(on_gpu + on_cpu) == sorted(everything)
    assert "decoders-arith-llada" in on_cpu and "sweep-var" in on_cpu and "e2e" in on_cpu
    assert [n for _, n, _ in listed(tmp_path, SPLIT="gpu", ONLY="^decoders-")] == [
        "decoders-var-llada", "decoders-var-dream"]
    assert [n for _, n, _ in listed(tmp_path, SPLIT="cpu", ONLY="^decoders-")] == [
        "decoders-arith-llada", "decoders-arith-dream"]


def test_docs_and_the_gpu_run_use_the_script_s_split(tmp_path):
    docs = (REPO / "docs" / "fixture-figures.md").read_text()
    assert "DEV=cuda SPLIT=gpu bash scripts/remeasure_fixture_figures.sh" in docs
    assert "SPLIT=cpu bash scripts/remeasure_fixture_figures.sh" in docs
    gpu_run = (REPO / "scripts" / "tiny_fixtures" / "gpu_run.sh").read_text()
    assert "SPLIT=gpu" in gpu_run and " ONLY=" not in gpu_run


def test_unknown_split_is_a_one_line_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SPLIT"}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")],
                          env={**env, "SPLIT": "gpus", "LIST": "1"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "SPLIT=gpus: must be gpu or cpu"
    assert not (tmp_path / "out").exists()
