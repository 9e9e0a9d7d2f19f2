"""``scripts/mutation.sh`` refuses a mistyped area or stage list with one line, before any work."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation.sh"


@pytest.mark.parametrize("env, args, message", [
    ({}, ["decoding", "stat"], "mutation.sh: AREA 'stat' must be one of: decoding, lmeval, stats, kv, gate"),
    ({"STAGES": "fast"}, ["gate"], "mutation.sh: STAGES='fast' must be one of: fast,full, full"),
])
def test_bad_arguments_are_one_line_errors(env, args, message, tmp_path):
    # PY points at nothing: the check must come before the script runs any Python or mutmut
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                       env={**os.environ, **env, "PY": str(tmp_path / "no-python")}, timeout=60)
    assert (r.returncode, r.stderr, r.stdout) == (2, message + "\n", "")
    assert not (SCRIPT.parents[1] / "mutation" / "stat").exists()
