"""pvf_lmeval.sandbox: verdicts and failure kinds, what a sandboxed program sees, the plain-
literal protocol between candidate and checker, refusal without isolation; the unbiased
pass@k estimator on hand-computed examples. (Attacks: tests/test_sandbox_attacks.py.)"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from pvf_lmeval.humaneval import pass_at_k
from pvf_lmeval.sandbox import (IsolationUnavailable, SandboxError, check_candidate,
                                check_candidates)
from pvf_lmeval.sandbox import literals
from pvf_lmeval.sandbox.bubblewrap import find_bwrap

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n"


def check(body: str, *, prompt=PROMPT, test=TEST, entry_point="add", **limits):
    return check_candidate(prompt + body, prompt=prompt, test=test, entry_point=entry_point,
                           **{"timeout": 1, "wall_timeout": 60, **limits})


# ------------------------------------------------------------------ verdicts

@pytest.mark.parametrize("body, reason, detail", [
    ("    return a + b\n", "passed", ""),
    ("    return a - b\n", "failed", "AssertionError"),
    ("    return (\n", "syntax", "SyntaxError: '(' was never closed (line 3)"),
    ("    return a\0\n", "syntax", "SyntaxError: source code string cannot contain null bytes"),
    ("    while True:\n        pass\n", "timeout", "CPU limit of 1 s"),
    ("    x = bytearray(1 << 34)\n", "memory", "MemoryError"),
    ("    raise ValueError('no')\n", "failed", "ValueError: no"),
    ("    raise SystemExit(0)\n", "failed", "CandidateError: SystemExit: 0"),
    ("    import os\n    os._exit(3)\n", "failed",
     "the candidate's process ended before answering (exit code 3)"),
    ("    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n", "signal",
     "the candidate's process was killed by SIGSEGV"),
    ("    return a + b\nimport sys\nsys.exit(0)\n", "failed", "while loading: SystemExit: 0"),
    ("    return a + b\nadd = 3\n", "failed", "while loading: TypeError: add is not callable"),
    ("    return 10 ** 5000\n", "failed", "TypeError: the result cannot cross: Exceeds the "
     "limit (4300 digits) for integer string conversion; use sys.set_int_max_str_digits() "
     "to increase the limit"),
])
def test_verdicts_and_failure_kinds(body, reason, detail):
    res = check(body)
    assert (res.passed, res.reason, res.detail) == (reason == "passed", reason, detail), res


def test_a_program_that_ignores_the_cpu_limits_warning_is_killed():
    res = check("    import signal\n    signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                "    while True:\n        pass\n")
    assert (res.passed, res.reason, res.detail) == (
        False, "signal", "the candidate's process was killed by SIGKILL (the CPU limit's hard "
                         "stop, if it ignored SIGXCPU)")


def test_a_program_that_blocks_hits_the_wall_clock_limit():
    # it would sleep far past the suite's per-test timeout: a limit that is not enforced hangs
    # this test until pytest-timeout fails it
    res = check("    import time\n    time.sleep(3600)\n", wall_timeout=2)
    assert (res.passed, res.reason, res.detail) == (False, "timeout", "wall-clock limit of 2 s")


def test_exceptions_cross_as_type_and_message():
    test = ("def check(candidate):\n"
            "    try:\n        candidate(-1, 0)\n"
            "    except ValueError as e:\n        assert str(e) == 'negative'\n"
            "    else:\n        raise AssertionError('no ValueError')\n")
    assert check("    raise ValueError('negative')\n", test=test).passed
    res = check("    raise TypeError('negative')\n", test=test)
    assert (res.reason, res.detail) == ("failed", "TypeError: negative")
    res = check("    class Negative(ValueError):\n        pass\n    raise Negative('negative')\n",
                test=test)  # not a builtin: it cannot be rebuilt as a ValueError
    assert (res.reason, res.detail) == ("failed", "CandidateError: Negative: negative")


VALUE = ("[1, -2, 10 ** 30, 2.5, -0.0, float('inf'), float('-inf'), 1 + 2j, 'x\\u00e9\\0', b'\\xff',"
         " None, True, False, (1, (2,)), [], {}, {1: [2], 'k': (3,)}, set(), {4}, frozenset({5})]")


def test_results_cross_as_plain_literals_of_the_same_types():
    test = ("import math\n"
            "def check(candidate):\n"
            f"    expected = {VALUE}\n"
            "    got = candidate(0, 0)\n"
            "    assert got == expected\n"
            "    assert [type(v) for v in got] == [type(v) for v in expected]\n"
            "    assert math.copysign(1, got[4]) == -1.0 and type(got[13][1]) is tuple\n"
            "    assert math.isnan(candidate(1, 0))\n"
            "    assert candidate(2, 0) is True\n")
    body = (f"    if a == 0:\n        return {VALUE}\n"
            "    return float('nan') if a == 1 else True\n")
    assert check(body, test=test).passed


def test_objects_of_the_candidate_never_reach_the_checker():
    test = "def check(candidate):\n    assert candidate(1, 1) == 2\n"
    body = ("    class Eq(int):\n        def __eq__(self, other):\n            return True\n"
            "    return Eq(7)\n")   # crosses as the int 7
    assert check(body, test=test).reason == "failed"
    res = check("    return lambda: 2\n", test=test)
    assert (res.reason, res.detail) == ("failed",
                                        "TypeError: the result cannot cross: a value of type "
                                        "function is not plain data")


def test_prompt_helpers_exist_on_both_sides():
    prompt = ('def encode(s: str):\n    return "".join(chr(ord(c) + 1) for c in s)\n\n\n'
              'def decode(s: str):\n    """Inverse of encode."""\n')
    test = ("def check(candidate):\n"
            "    for s in ('abc', 'hello', ''):\n        assert candidate(encode(s)) == s\n")
    body = '    return "".join(chr(ord(c) - 1) for c in s)\n'
    res = check(body, prompt=prompt, test=test, entry_point="decode")
    assert res.passed, res
    assert check('    return s\n', prompt=prompt, test=test, entry_point="decode").reason == \
        "failed"


def test_a_problem_that_cannot_be_checked_across_processes_is_an_error():
    test = "def check(candidate):\n    assert candidate(lambda: 1, 2) == 3\n"
    with pytest.raises(SandboxError, match="cannot be checked across processes: an argument "
                                           "cannot cross as plain data: a value of type function"):
        check("    return a() + b\n", test=test)
    with pytest.raises(SandboxError, match="the prompt or test does not run: SyntaxError"):
        check("    return a + b\n", test="def check(candidate:\n")


def test_many_candidates_in_order_in_parallel():
    bodies = ["    return a + b\n", "    return a - b\n", "    while True:\n        pass\n",
              "    return b + a\n", "    return (\n"]
    res = check_candidates([dict(program=PROMPT + b, prompt=PROMPT, test=TEST, entry_point="add")
                            for b in bodies], workers=3, timeout=1)
    assert [r.reason for r in res] == ["passed", "failed", "timeout", "passed", "syntax"]


# ------------------------------------------------------------------ what the program sees

SEES = '''    import os, socket, resource
    def writable(p):
        try:
            open(p, "w").close()
            return True
        except OSError:
            return False
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    return {
        "ids": (os.getuid(), os.getgid(), os.geteuid()),
        "root": sorted(os.listdir("/")),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "interfaces": [n for _, n in socket.if_nameindex()],
        "hostname": socket.gethostname(),
        "writable": [p for p in ("/tmp/x", "/x", "/usr/x", "/dev/x", "/dev/shm/x", "/proc/x")
                     if writable(p)],
        "cwd": os.getcwd(), "env": dict(os.environ),
        "caps": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
        "seccomp": status["Seccomp"].strip(),
        "cpu": resource.getrlimit(resource.RLIMIT_CPU),
        "as": resource.getrlimit(resource.RLIMIT_AS),
        "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    }
'''


SEEN = [  # (fact, what it must be): checked by the (trusted) test code in the checker
    ("seen['ids']", "(65534, 65534, 65534)"),
    ("set(seen['root']) - {'bin', 'dev', 'etc', 'lib', 'lib32', 'lib64', 'libx32', 'proc', "
     "'pvf_sandbox', 'sbin', 'tmp', 'usr', PYTHON_TOP}", "set()"),
    ("seen['pids']", "[1, 2]"),                    # its own PID namespace: the reaper and it
    ("seen['interfaces']", "['lo']"),              # its own network namespace
    ("seen['hostname']", "'sandbox'"),
    ("seen['writable']", "['/tmp/x']"),            # the private tmpfs, nothing else
    ("seen['cwd']", "'/tmp'"),
    ("sorted(seen['env'])", "sorted(['HOME', 'TMPDIR', 'PATH', 'LANG', 'OMP_NUM_THREADS', "
                            "'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS', 'PWD'])"),
    ("int(seen['caps'], 16)", "0"),
    ("seen['no_new_privs']", "'1'"),
    ("seen['seccomp']", "'2'"),
    ("seen['cpu']", "(1, 2)"),
    ("seen['as']", "(512 << 20, 512 << 20)"),
    ("seen['fsize']", "(8 << 20, 8 << 20)"),
    # /dev/null stdio, its two pipe ends and the listing's own descriptor: nothing else
    ("(seen['fds'][:3], len(seen['fds']))", "([0, 1, 2], 6)"),
]


def test_what_a_sandboxed_program_sees():
    top = sys.base_prefix.strip("/").split("/")[0]
    lines = [f"    assert {fact} == {want}, {fact!r} + ' = ' + repr({fact})"
             for fact, want in SEEN]
    test = f"PYTHON_TOP = {top!r}\ndef check(candidate):\n    seen = candidate(0, 0)\n" + \
        "\n".join(lines) + "\n"
    res = check(SEES, test=test, memory_mb=512, fsize_mb=8)
    assert res.passed, res


# ------------------------------------------------------------------ refusing

def test_refuses_without_bubblewrap(monkeypatch):
    monkeypatch.setenv("PVF_BWRAP", "/nonexistent/bwrap")
    monkeypatch.delenv("PVF_UNSAFE_NO_SANDBOX", raising=False)
    for run in (lambda: check("    return a + b\n"),
                lambda: check_candidates([dict(program=PROMPT, prompt=PROMPT, test=TEST,
                                               entry_point="add")])):
        with pytest.raises(IsolationUnavailable) as exc:
            run()
        msg = str(exc.value)
        assert "\n" not in msg
        assert "bubblewrap (bwrap) is not available" in msg and "PVF_UNSAFE_NO_SANDBOX=1" in msg


def test_refuses_where_user_namespaces_are_forbidden():
    """Inside a container that forbids new user namespaces (bwrap --disable-userns)."""
    prog = ("from pvf_lmeval.sandbox import check_candidate\n"
            f"check_candidate({PROMPT!r}, prompt={PROMPT!r}, test={TEST!r}, entry_point='add')\n")
    done = subprocess.run([find_bwrap(), "--dev-bind", "/", "/", "--unshare-user",
                           "--disable-userns", "--", sys.executable, "-c", prog],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pvf_lmeval.sandbox.bubblewrap.IsolationUnavailable: "
                           "pvf_lmeval.sandbox: refusing to run model-written code: a user "
                           "namespace is not available ("), last
    assert "set PVF_UNSAFE_NO_SANDBOX=1 to run it without any isolation (unsafe)" in last


def test_unsafe_opt_out_runs_without_isolation_and_says_so(monkeypatch, caplog):
    monkeypatch.setenv("PVF_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setenv("PVF_UNSAFE_NO_SANDBOX", "1")
    with caplog.at_level("WARNING", logger="pvf_lmeval"):
        assert check("    return a + b\n").passed
        res = check("    import os\n    return os.getpid()\n",
                    test="def check(candidate):\n    assert candidate(0, 0) > 2\n")
    assert res.passed  # the host's PID space: not isolated
    assert "WITHOUT isolation" in caplog.text


# ------------------------------------------------------------------ the literal protocol

@pytest.mark.parametrize("value", [
    0, -1, 2 ** 100, 1.5, float("inf"), -math.inf, 3j, "é\0", b"\x00", None, True,
    [1, [2, (3, {4: {5}})]], (), {"a": frozenset({1})}, {(1, 2): [None]}, set(),
])
def test_literals_round_trip(value):
    fd_r, fd_w = os.pipe()
    try:
        literals.send(fd_w, ("return", literals.to_tree(value)))
        got = literals.from_tree(literals.recv(fd_r)[1])
    finally:
        os.close(fd_r)
        os.close(fd_w)
    assert got == value and type(got) is type(value)


def test_literals_refuse_what_is_not_plain_data():
    class Sub(list):
        pass

    for bad in (len, object(), Sub([1]), [1, {2: print}]):
        with pytest.raises(literals.NotPlainData):
            literals.to_tree(bad)
    assert literals.from_tree(literals.to_tree(Sub([1, 2]), lenient=True)) == [1, 2]
    for tree in (["l", ()], ("x", ()), ("l", [1]), ("d", ((1,),)), ("f", "1.0")):
        with pytest.raises(literals.ProtocolError):
            literals.from_tree(tree)


@pytest.mark.parametrize("body", [b"__import__('os').system('true')", b"(1,", b"[('ready',)]",
                                  b"(lambda: 1,)"])
def test_frames_that_are_not_plain_literals_are_refused(body):
    fd_r, fd_w = os.pipe()
    try:
        os.write(fd_w, len(body).to_bytes(4, "big") + body)
        with pytest.raises(literals.ProtocolError):
            literals.recv(fd_r)
    finally:
        os.close(fd_r)
        os.close(fd_w)


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
