"""Launching tensor parallel: a failing rank, and data parallel x tensor parallel through lm-eval.

A tensor-parallel rank that fails makes the others stop at once, in one line naming it. Two real
processes with torchrun's environment (no agent to kill the survivor), gloo on the
CPU, the lm-eval adapter on tiny-llada at ``tensor_parallel_size=2``: rank 1 raises at its third
model call, in the middle of decoding, while rank 0 computes its part of the same call. Rank 0
must end within a bounded time (its next collective fails as the peer's sockets close) with one
line that names rank 1 and its error, read from the note rank 1 left in the process group's
store.

The slow tier (``PVF_PARALLEL_TESTS=1``): ``torchrun --nproc_per_node 4`` at
``tensor_parallel_size=2`` (two model copies of two ranks) gives one process's samples.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.ranks import free_port, rank_env

TESTS = Path(__file__).resolve().parent
#: seconds rank 0 may take to stop after rank 1 ended
BOUND = 60


def test_a_failing_rank_stops_the_other_in_one_line():
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, **rank_env(rank, 2, port), "FAIL_RANK": "1",
               "PYTHONPATH": str(TESTS), "PYTHONWARNINGS": "ignore"}
        procs.append(subprocess.Popen([sys.executable, "-m", "helpers.dying_rank"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        procs[1].wait(timeout=600)
        died = time.monotonic()
        procs[0].wait(timeout=BOUND)
        assert time.monotonic() - died < BOUND
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out0, err0 = procs[0].communicate()
    out1, err1 = procs[1].communicate()
    assert "decoding" in out0 and "decoding" in out1        # both got as far as decoding
    assert "finished" not in out0 and procs[0].returncode == 1 and procs[1].returncode == 1
    assert "RuntimeError: injected failure at call 3" in err1
    last = err0.strip().splitlines()[-1]
    assert last == ("pvf-dlm: rank 1 failed (RuntimeError: injected failure at call 3); "
                    "rank 0 stops too"), err0[-3000:]
    assert "Traceback" not in err0


def _samples(out: Path) -> dict:
    (path,) = glob.glob(str(out / "**" / "samples_arith_*.jsonl"), recursive=True)
    return {r["doc_id"]: r for r in map(json.loads, Path(path).read_text().splitlines())}


@pytest.mark.skipif(os.environ.get("PVF_PARALLEL_TESTS") != "1",
                    reason="slow parallel tier: set PVF_PARALLEL_TESTS=1 to run it")
def test_two_copies_of_two_ranks_give_the_samples_of_one_process(tmp_path):
    """dp 2 x tp 2 on 4 gloo processes: lm-eval's two ranks are the two model copies; every
    document's answer and NFE are one process's."""
    bin_ = Path(sys.executable).parent
    args = "pretrained=tiny-llada,decoder=threshold,gen_length=64,block_length=32,cache=dual"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

    def run(launcher: list[str], model_args: str, out: Path) -> dict:
        proc = subprocess.run(
            launcher + ["--model", "pvf-dlm", "--model_args", model_args, "--include_path",
                        str(TESTS.parent / "tasks"), "--tasks", "arith", "--limit", "6",
                        "--output_path", str(out), "--log_samples"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return _samples(out)

    one = run([str(bin_ / "lm_eval")], args, tmp_path / "one")
    four = run([str(bin_ / "torchrun"), "--standalone", "--nproc_per_node", "4", "-m",
                "lm_eval"], f"{args},tensor_parallel_size=2,data_parallel_size=2", tmp_path / "dp2tp2")
    assert sorted(four) == sorted(one) == list(range(6))
    for i in range(6):
        assert four[i]["resps"] == one[i]["resps"] and four[i]["nfe"] == one[i]["nfe"], i
