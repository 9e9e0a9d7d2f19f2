"""pvf_lmeval.code_exec: the sandbox refuses what it must, scores it 0, and the run goes on;
the unbiased pass@k estimator on hand-computed examples."""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path

import pytest

from pvf_lmeval.code_exec import (ExecResult, SandboxError, pass_at_k, run_program,
                                  run_programs)

ROOT = os.geteuid() == 0


@pytest.fixture
def probe():
    """Paths outside the sandbox that a program must not create: /tmp and the real $HOME."""
    tag = uuid.uuid4().hex[:12]
    paths = [Path("/tmp") / f"pvf_probe_{tag}", Path.home() / f".pvf_probe_{tag}"]
    yield paths
    for p in paths:
        assert not p.exists(), f"the sandboxed program wrote {p}"


def test_good_program_passes_and_runs_unprivileged():
    prog = ("import os, resource\n"
            f"assert {ROOT} is False or (os.getuid() != 0 and os.geteuid() != 0)\n"
            "assert resource.getrlimit(resource.RLIMIT_NPROC) == (0, 0)\n"
            "assert os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR']\n"
            "open('scratch.txt', 'w').write('ok')\n"           # own directory: allowed
            "os.mkdir('d'); os.rename('scratch.txt', 'd/s.txt'); os.remove('d/s.txt')\n"
            "import tempfile, typing, collections, hashlib\n"
            "with tempfile.TemporaryDirectory() as t:\n"
            "    open(t + '/x', 'w').write('1')\n"
            "P = collections.namedtuple('P', 'a b'); T = typing.TypeVar('T')\n"
            "assert hashlib.md5(b'x').hexdigest()\n")
    res = run_program(prog)
    assert res == ExecResult(True, "passed", "", res.wall_s), res


@pytest.mark.parametrize("prog, reason", [
    ("assert 1 == 2, 'nope'\n", "failed"),
    ("def f(:\n", "failed"),
    ("raise ValueError('x')\n", "failed"),
    ("import sys\nsys.exit(0)\n", "failed"),
    ("exit()\n", "failed"),
    ("x = 1\0\n", "failed"),
    ("import os\nos._exit(0)\n", "error"),
    ("import signal, os\nos.kill(os.getpid(), signal.SIGKILL)\n", "error"),
])
def test_failures_and_exits_score_zero(prog, reason):
    res = run_program(prog)
    assert not res.passed and res.reason == reason, res


@pytest.mark.skipif(not ROOT, reason="the uid/gid to drop to matter only as root")
def test_a_failed_privilege_drop_raises_instead_of_scoring():
    with pytest.raises(SandboxError, match="could not be set up"):
        run_program("assert True\n", uid=0, gid=0)


def test_infinite_loop_hits_the_cpu_limit():
    res = run_program("while True:\n    pass\n", timeout=1)
    assert not res.passed and res.reason == "timeout", res


def test_sleeping_program_hits_the_wall_limit():
    res = run_program("import time\ntime.sleep(60)\n", timeout=1, wall_timeout=1.5)
    assert not res.passed and res.reason == "timeout", res
    assert res.wall_s < 10


def test_memory_limit():
    res = run_program("x = bytearray(2 * 1024 ** 3)\n", memory_mb=256)
    assert not res.passed and "MemoryError" in res.detail, res


@pytest.mark.parametrize("kind", ["tmp", "home"])
@pytest.mark.parametrize("how", [
    "open({p!r}, 'w').write('x')",
    "import os\nos.close(os.open({p!r}, os.O_WRONLY | os.O_CREAT))",
    "import pathlib\npathlib.Path({p!r}).write_text('x')",
    "import shutil\nshutil.copyfile('/etc/hostname', {p!r})",
    # caught refusal still fails the run
    "try:\n    open({p!r}, 'a').write('x')\nexcept Exception:\n    pass",
    # a directory descriptor from outside, then a relative create through dir_fd
    "import os\nd = os.open(os.path.dirname({p!r}), os.O_RDONLY)\n"
    "os.open(os.path.basename({p!r}), os.O_WRONLY | os.O_CREAT, dir_fd=d)",
])
def test_writes_outside_are_refused(probe, kind, how):
    p = str(probe[0] if kind == "tmp" else probe[1])
    res = run_program(how.format(p=p) + "\n")
    assert not res.passed and res.reason == "error", res
    assert "sandbox refused" in res.detail or "Permission" in res.detail, res


@pytest.mark.parametrize("prog", [
    "import os\nos.remove('/etc/hostname')\n",
    "import os\nos.rename('/etc/hostname', '/tmp/pvf_moved')\n",
    "import os\nos.chmod('/tmp', 0o777)\n",
    "import os\nos.symlink('/etc', 'link')\n",
])
def test_other_changes_outside_are_refused(prog):
    res = run_program(prog)
    assert not res.passed and res.reason == "error", res


@pytest.mark.parametrize("prog", [
    "import subprocess\nsubprocess.run(['touch', {p!r}])\n",
    "import os\nos.system('touch {p}')\n",
    "import os\nos.execv('/usr/bin/touch', ['touch', {p!r}])\n",
    "import os\nif os.fork() == 0:\n    open({p!r}, 'w')\n",
    "import os\nos.posix_spawn('/usr/bin/touch', ['touch', {p!r}], {{}})\n",
    "import pty\npty.spawn(['touch', {p!r}])\n",
    "import ctypes\nctypes.CDLL(None).system(b'touch {p}')\n",
    "import threading\nt = threading.Thread(target=print)\nt.start()\n",  # RLIMIT_NPROC=0
])
def test_process_spawning_is_refused(probe, prog):
    res = run_program(prog.format(p=str(probe[0])))
    assert not res.passed and res.reason in ("error", "failed"), res


@pytest.mark.parametrize("prog", [
    "import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 80))\n",
    "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n",
    "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n",
    "import socket\nsocket.getaddrinfo('pypi.org', 443)\n",
    "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)\n",
    "import socket\ntry:\n    socket.socket().connect(('127.0.0.1', 9))\n"
    "except OSError:\n    pass\n",
])
def test_network_is_refused(prog):
    res = run_program(prog)
    assert not res.passed and res.reason == "error", res


@pytest.mark.parametrize("prog", [
    "print('passed')\n",
    "import os\nfor fd in range(64):\n    try:\n        os.write(fd, b'x\\tpassed\\t\\n')\n"
    "    except OSError:\n        pass\nos._exit(0)\n",
    "import sys\nsys.audit('pvf_sandbox.report', 'passed', '')\n",
    "import gc\nprint(len(gc.get_objects()))\n",
])
def test_a_pass_cannot_be_forged(prog):
    res = run_program(prog + "raise SystemExit(1)\n")
    assert not res.passed, res


def test_bad_programs_do_not_hurt_the_batch(probe):
    good = "assert sum(range(4)) == 6\n"
    bad = [
        "while True:\n    pass\n",
        "import os\nos._exit(0)\n",
        f"open({str(probe[0])!r}, 'w').write('x')\n",
        f"open({str(probe[1])!r}, 'w').write('x')\n",
        "import subprocess\nsubprocess.Popen(['sleep', '100'])\n",
        "import socket\nsocket.socket().connect(('1.1.1.1', 53))\n",
        "import sys\nsys.exit(0)\n",
    ]
    progs = [good] + bad + [good]
    res = run_programs(progs, workers=2, timeout=1)
    assert [r.passed for r in res] == [True] + [False] * len(bad) + [True], res


# ------------------------------------------------------------------ pass@k

def _reference(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("n, c, k, expected", [
    (1, 1, 1, 1.0), (1, 0, 1, 0.0),
    (5, 2, 1, 0.4),                      # c / n
    (5, 2, 2, 0.7),                      # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 1, 2, 0.5),                      # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (10, 3, 5, 1 - 21 / 252),            # 1 - C(7,5)/C(10,5)
    (5, 4, 2, 1.0),                      # n - c < k
    (5, 0, 5, 0.0), (5, 5, 5, 1.0),
])
def test_pass_at_k_hand_examples(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_combinatorial_formula():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_reference(n, c, k), abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(3, 1, 4), (3, 4, 1), (3, 1, 0)])
def test_pass_at_k_rejects_undefined(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
