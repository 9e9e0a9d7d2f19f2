"""A tensor-parallel rank that fails makes the others stop at once, in one line naming it.

Two real processes with torchrun's environment (no agent to kill the survivor), gloo on the
CPU, the lm-eval adapter on tiny-llada at ``tensor_parallel_size=2``: rank 1 raises at its third
model call, in the middle of decoding, while rank 0 computes its part of the same call. Rank 0
must end within a bounded time (its next collective fails as the peer's sockets close) with one
line that names rank 1 and its error, read from the note rank 1 left in the process group's
store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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
