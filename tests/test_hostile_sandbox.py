"""Hostile programs against the sandbox's own code (not its walls: tests/test_sandbox_attacks.py):
whatever a program does, the evaluation goes on with a verdict; the sandbox shows the Python
installation, never the user's home folder."""

from __future__ import annotations

import pytest

from pvf_lmeval.sandbox import check_candidate, check_candidates
from pvf_lmeval.sandbox.bubblewrap import python_paths

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
NAMELESS = ("import functools, sys\n"
            "class _M(type):\n"
            "    __name__ = property(functools.partial(sys.audit, 'x', 'y'))\n"
            "class _E(Exception, metaclass=_M):\n"
            "    pass\n")
RAISING_NAME = ("class _M(type):\n"
                "    @property\n"
                "    def __name__(cls):\n"
                "        raise RuntimeError('no name')\n"
                "class _E(Exception, metaclass=_M):\n"
                "    pass\n")


def check(program: str):
    return check_candidate(program, prompt=PROMPT, test=TEST, entry_point="add", timeout=1,
                           wall_timeout=60)


@pytest.mark.parametrize("meta", [NAMELESS, RAISING_NAME], ids=["name-is-None", "name-raises"])
def test_an_exception_class_without_a_string_name_is_a_failed_sample(meta):
    # raised while the program loads: the checker used to fail on the name and raise into lm-eval
    res = check(PROMPT + "    return a + b\n" + meta + "raise _E('boom')\n")
    assert (res.passed, res.reason, res.detail) == (False, "failed", "while loading: _E: boom")
    # raised by a call: the name crosses to the checker as the class's own name
    res = check(meta + PROMPT + "    raise _E('boom')\n")
    assert (res.passed, res.reason, res.detail) == (False, "failed", "CandidateError: _E: boom")


def test_a_batch_with_a_hostile_sample_scores_every_sample():
    jobs = [dict(program=p, prompt=PROMPT, test=TEST, entry_point="add") for p in (
        PROMPT + "    return a + b\n",
        PROMPT + "    return a + b\n" + NAMELESS + "raise _E()\n",
        PROMPT + "    return a - b\n")]
    results = check_candidates(jobs, workers=1, timeout=1, wall_timeout=60)
    assert [(r.passed, r.reason) for r in results] == [(True, "passed"), (False, "failed"),
                                                      (False, "failed")]
    assert results[1].detail == "while loading: _E"


def test_the_checker_failing_is_a_failed_sample_not_an_exception():
    from pvf_lmeval.sandbox.run import _classify, ExecResult

    def result(reason, detail=""):
        return ExecResult(reason == "passed", reason, detail)

    verdict = repr(("error", "TypeError: boom")).encode("ascii")
    res = _classify(len(verdict).to_bytes(4, "big") + verdict, 1, 0, 1, result)
    assert (res.passed, res.reason, res.detail) == (False, "failed",
                                                    "the checker failed: TypeError: boom")


# --- what the sandbox shows of the Python installation ---------------------------------------------

def test_a_python_in_the_home_bin_folder_does_not_expose_the_home_folder():
    exe, paths = python_paths("/home/u/bin/python3.11", "/home/u",
                              "/home/u/lib/python3.11", "/home/u")
    assert exe == "/home/u/bin/python3.11"
    assert paths == ["/home/u/bin/python3.11", "/home/u/lib/python3.11"]


def test_a_prefix_above_the_home_folder_is_not_shown():
    exe, paths = python_paths("/opt/bin/python3", "/", "/opt/lib/python3.11", "/opt/home")
    assert paths == ["/opt/bin/python3", "/opt/lib/python3.11"]
    exe, paths = python_paths("/home/bin/python3", "/home", "/home/lib/python3.11", "/home/u")
    assert paths == ["/home/bin/python3", "/home/lib/python3.11"]


def test_an_installation_inside_the_home_folder_is_shown_as_its_prefix():
    exe, paths = python_paths("/home/u/.pyenv/versions/3.11.7/bin/python3.11",
                              "/home/u/.pyenv/versions/3.11.7", None, "/home/u")
    assert paths == ["/home/u/.pyenv/versions/3.11.7"]


def test_a_system_python_adds_nothing_beyond_usr():
    assert python_paths("/usr/bin/python3.11", "/usr", "/usr/lib/python3.11", "/root") == \
        ("/usr/bin/python3.11", [])


# --- memory a sample could hold outside its address-space limit ---------------------------------

#: each program tries to hold 384 to 512 MiB (or 20,000 files) outside its 256 MiB RLIMIT_AS and
#: answers right only if it managed to: a sandbox that lets it through passes a wrong program
HOLD = {
    "memfd": ("import os\n"            # 48 memfds of 8 MiB: each under RLIMIT_FSIZE (16 MiB)
              "held = []\n"
              "def hold():\n"
              "    for _ in range(48):\n"
              "        fd = os.memfd_create('x')\n"
              "        for _ in range(8):\n"
              "            os.write(fd, b'1' * (1 << 20))\n"
              "        held.append(fd)\n"),
    "sysv-shm": ("import ctypes\n"
                 "def hold():\n"
                 "    libc = ctypes.CDLL(None, use_errno=True)\n"
                 "    libc.shmat.restype = ctypes.c_void_p\n"
                 "    for _ in range(16):\n"
                 "        sid = libc.shmget(0, 32 << 20, 0o1600)\n"
                 "        if sid < 0:\n"
                 "            raise OSError(ctypes.get_errno(), 'shmget')\n"
                 "        a = libc.shmat(sid, None, 0)\n"
                 "        ctypes.memset(a, 1, 32 << 20)\n"
                 "        libc.shmdt(ctypes.c_void_p(a))\n"),
    "sysv-msg": ("import ctypes\n"
                 "def hold():\n"
                 "    libc = ctypes.CDLL(None, use_errno=True)\n"
                 "    for _ in range(64):\n"
                 "        if libc.msgget(0, 0o1600) < 0:\n"
                 "            raise OSError(ctypes.get_errno(), 'msgget')\n"),
    "tmpfs-inodes": ("import os\n"
                     "def hold():\n"
                     "    for i in range(20000):\n"
                     "        open('/tmp/%0200d' % i, 'w').close()\n"),
}


@pytest.mark.parametrize("channel, refused", [
    ("memfd", "PermissionError: [Errno 1] Operation not permitted"),
    ("sysv-shm", "PermissionError: [Errno 1] shmget"),
    ("sysv-msg", "PermissionError: [Errno 1] msgget"),
    ("tmpfs-inodes", "OSError: [Errno 28] No space left on device"),
])
def test_memory_outside_the_address_space_limit_is_refused(channel, refused):
    program = (HOLD[channel] + "def add(a, b):\n"
               "    try:\n        hold()\n"
               "    except OSError as e:\n        raise RuntimeError(f'{type(e).__name__}: {e}')\n"
               "    return a + b\n")
    res = check_candidate(program, prompt=PROMPT, test=TEST, entry_point="add", timeout=10,
                          wall_timeout=120, memory_mb=256, tmpfs_mb=16)
    assert (res.passed, res.reason) == (False, "failed")
    assert res.detail.startswith(f"RuntimeError: {refused}")
