"""pvf_lmeval.sandbox.check_asserts (MBPP): a problem's assert lines run in the checker against
the candidate's top-level names, which resolve to plain proxies; the verdicts, what counts as
``unchecked``, and hostile candidates that a naive check (the program and its asserts exec'd in
one namespace, as OpenCompass's MBPPEvaluator does) passes. (HumanEval's entry-point check:
tests/test_humaneval_exec.py; the sandbox's walls: tests/test_sandbox_attacks.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pvf_lmeval.sandbox import (REASONS, SandboxError, assert_names, check_asserts,
                                check_candidate, check_candidates)

ASSERTS = ["assert remove_occ('hello', 'l') == 'heo'",
           "assert remove_occ('abcda', 'a') == 'bcd'",
           "assert remove_occ('PHP', 'P') == 'H'"]
RIGHT = ("def remove_occ(s, ch):\n"
         "    s = s.replace(ch, '', 1)\n"
         "    i = s.rfind(ch)\n"
         "    return s if i < 0 else s[:i] + s[i + 1:]\n")


def check(program, asserts=ASSERTS, setup="", **limits):
    return check_asserts(program, asserts=asserts, setup=setup,
                         **{"timeout": 1, "wall_timeout": 60, **limits})


def outcome(res):
    return res.passed, res.reason, res.detail


def naive_passes(program, asserts=ASSERTS, setup=""):
    """What a check in one namespace says: OpenCompass's program (the answer, then the tests)
    exec'd in one plain process, passed when it exits 0. Only the benign attacks below run
    here, outside any sandbox: they patch their own process, print and exit."""
    source = program + "\n" + setup + "\n" + "\n".join(asserts) + "\n"
    run = subprocess.run([sys.executable, "-I", "-c", "exec(compile(%r, 'p', 'exec'), {})"
                          % source], capture_output=True, timeout=60)
    return run.returncode == 0


# ------------------------------------------------------------------ which names cross

def test_the_names_a_check_asks_for():
    asserts = ["assert f(1) == g([x for x in range(3)])",
               "assert math.isclose(h(root), 1.0)", "assert len(K) == 2 and sorted(K) == K"]
    setup = "import heapq as hq\nclass Node:\n    pass\nroot = Node()\n"
    # builtins (len, sorted, range) and what the setup binds (Node, root, hq) never come from
    # the program; the comprehension's own variable is asked for and resolves locally
    assert assert_names(asserts, setup) == ["K", "f", "g", "h", "math", "x"]
    with pytest.raises(SandboxError, match="this problem's test does not parse"):
        assert_names(["assert f(1 =="])


def test_a_problem_without_asserts_is_an_error_not_a_pass():
    with pytest.raises(SandboxError, match="this problem has no assert lines to check"):
        check(RIGHT, [])


# ------------------------------------------------------------------ verdicts

@pytest.mark.parametrize("program, asserts, verdict", [
    (RIGHT, ASSERTS, (True, "passed", "")),
    ("def remove_occ(s, ch):\n    return s.replace(ch * 2, '')\n", ASSERTS,
     (False, "failed", "AssertionError (assert 2 of 3)")),
    ("def remove_occ(s, ch):\n    return s[10]\n", ASSERTS,
     (False, "failed", "IndexError: string index out of range (assert 1 of 3)")),
    ("def remove_ch(s, ch):\n    return s\n", ASSERTS,
     (False, "failed", "NameError: name 'remove_occ' is not defined (assert 1 of 3)")),
    ("def remove_occ(s, ch):\n    return (\n", ASSERTS,
     (False, "syntax", "SyntaxError: '(' was never closed (line 2)")),
    ("def remove_occ(s, ch):\n    while True:\n        pass\n", ASSERTS,
     (False, "timeout", "CPU limit of 1 s")),
    # a module the program imported is the checker's own import of it; not imported: as in
    # one namespace, a NameError
    ("import math\ndef area(r):\n    return math.pi * r * r\n",
     ["assert math.isclose(area(2), 12.566370614359172)"], (True, "passed", "")),
    ("from math import pi\ndef area(r):\n    return pi * r * r\n",
     ["assert math.isclose(area(2), 12.566370614359172)"],
     (False, "failed", "NameError: name 'math' is not defined (assert 1 of 1)")),
    # a global of plain data crosses as its literal
    ("PRIMES = (2, 3, 5)\n", ["assert PRIMES == (2, 3, 5) and type(PRIMES) is tuple"],
     (True, "passed", "")),
])
def test_verdicts(program, asserts, verdict):
    assert outcome(check(program, asserts)) == verdict


def test_values_that_cannot_cross_are_unchecked_never_passed():
    # MBPP's tree problems: the setup builds instances of its own class and passes them
    setup = ("class Node:\n    def __init__(self, left=None, right=None):\n"
             "        self.left, self.right = left, right\nroot = Node(Node(), Node(Node()))\n")
    height = ("def max_height(node):\n    if node is None:\n        return 0\n"
              "    return 1 + max(max_height(node.left), max_height(node.right))\n")
    res = check(height, ["assert max_height(root) == 3"], setup)
    assert outcome(res) == (False, "unchecked", "an argument cannot cross as plain data: a "
                                                "value of type Node is not plain data")
    assert naive_passes(height, ["assert max_height(root) == 3"], setup)
    # an object the program returns, or holds at top level
    res = check("def pair(a, b):\n    return iter((a, b))\n", ["assert list(pair(1, 2)) == [1, 2]"])
    assert outcome(res) == (False, "unchecked", "the result of pair cannot cross: a value of "
                                                "type tuple_iterator is not plain data")
    res = check("class Node:\n    pass\nroot = Node()\ndef size(n):\n    return 1\n",
                ["assert size(root) == 1"])
    assert outcome(res) == (False, "unchecked", "root is a Node object, not plain data")
    assert "unchecked" in REASONS


def test_jobs_with_asserts_run_beside_entry_point_jobs():
    prompt = 'def add(a, b):\n    """Return a + b."""\n'
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    jobs = [dict(program=RIGHT, asserts=ASSERTS),
            dict(program=prompt + "    return a + b\n", prompt=prompt, test=test,
                 entry_point="add"),
            dict(program="def remove_occ(s, ch):\n    return s\n", asserts=ASSERTS)]
    res = check_candidates(jobs, workers=2, timeout=1, wall_timeout=60)
    assert [r.reason for r in res] == ["passed", "passed", "failed"]


# ------------------------------------------------------------------ hostile candidates

FORGED_EQ = ("class Anything:\n    def __eq__(self, other):\n        return True\n"
             "def remove_occ(s, ch):\n    return Anything()\n")
# an int subclass whose __eq__ and __repr__ lie: it crosses as the int it is
FORGED_INT = ("class Seven(int):\n    def __eq__(self, other):\n        return True\n"
              "    __hash__ = int.__hash__\n"
              "    def __repr__(self):\n        return '12'\n"
              "def double(x):\n    return Seven(7)\n")


def test_a_forged_eq_never_passes():
    assert naive_passes(FORGED_EQ)
    assert outcome(check(FORGED_EQ)) == (
        False, "unchecked", "the result of remove_occ cannot cross: a value of type Anything is "
                            "not plain data")
    asserts = ["assert double(6) == 12"]
    assert naive_passes(FORGED_INT, asserts)
    assert outcome(check(FORGED_INT, asserts)) == (False, "failed",
                                                   "AssertionError (assert 1 of 1)")


PATCHED_BUILTINS = (
    "import builtins\n"
    "class Fine(Exception):\n    pass\n"
    "builtins.AssertionError = Fine\n"
    "def sorted(x):\n    return [1, 2]\n"
    "def len(x):\n    return 2\n"
    "def pair(a, b):\n    return [a]\n")
BUILTIN_ASSERTS = ["assert sorted(pair(2, 1)) == [1, 2]", "assert len(pair(1, 2)) == 2"]


def test_builtins_are_the_checkers_own_whatever_the_program_defines_or_patches():
    assert naive_passes(PATCHED_BUILTINS, BUILTIN_ASSERTS)
    assert outcome(check(PATCHED_BUILTINS, BUILTIN_ASSERTS)) == (
        False, "failed", "AssertionError (assert 1 of 2)")


# writes the checker's "passed" verdict frame to every descriptor it may hold and prints it
FAKE_VERDICT = (
    "import os, sys\n"
    "FRAME = len(repr(('passed',))).to_bytes(4, 'big') + repr(('passed',)).encode()\n"
    "def forge():\n"
    "    for fd in range(1, 1024):\n"
    "        try:\n            os.write(fd, FRAME)\n        except OSError:\n            pass\n"
    "    print(\"('passed',)\")\n    print(\"('passed',)\", file=sys.stderr)\n"
    "forge()\n"
    "def remove_occ(s, ch):\n    forge()\n    return s\n")


def test_a_verdict_written_or_printed_by_the_program_is_not_read():
    res = check(FAKE_VERDICT)
    assert (res.passed, res.reason) == (False, "failed"), res


EXIT_AT_LOAD = "import os\nos._exit(0)\n"
SWALLOWS = ("def raises(f, *args):\n    try:\n        f(*args)\n"
            "    except Exception:\n        return True\n    return False\n")


def test_exiting_early_is_a_failure():
    assert naive_passes(EXIT_AT_LOAD)
    assert outcome(check(EXIT_AT_LOAD)) == (
        False, "failed", "the candidate's process ended before it loaded (exit code 0)")


def test_ending_or_an_opaque_result_is_remembered_though_the_test_swallows_it():
    # the setup's helper swallows the exception a call raises: a check that took the
    # helper's word would pass these
    asserts = ["assert raises(root_of, -1)"]
    exits = "import os\ndef root_of(x):\n    os._exit(0)\n"
    assert naive_passes(exits, asserts, SWALLOWS)
    assert outcome(check(exits, asserts, SWALLOWS)) == (
        False, "failed", "the candidate's process ended before answering (exit code 0)")
    opaque = "def root_of(x):\n    return object()\n"
    assert outcome(check(opaque, asserts, SWALLOWS)) == (
        False, "unchecked", "the result of root_of cannot cross: a value of type object is not "
                            "plain data")


def test_an_entry_point_candidate_cannot_claim_its_result_cannot_cross():
    # with entry_point an uncheckable problem is the dataset's fault (SandboxError): a program
    # that answers so itself, on the pipe it finds, is a failed sample
    prompt = 'def add(a, b):\n    """Return a + b."""\n'
    body = ("    import os\n"
            "    frame = repr(('opaque', 'x')).encode()\n"
            "    for fd in range(3, 64):\n"
            "        try:\n"
            "            os.write(fd, len(frame).to_bytes(4, 'big') + frame)\n"
            "        except OSError:\n"
            "            pass\n"
            "    os._exit(0)\n")
    res = check_candidate(prompt + body, prompt=prompt, entry_point="add", timeout=1,
                          wall_timeout=60,
                          test="def check(candidate):\n    assert candidate(2, 3) == 5\n")
    assert outcome(res) == (False, "failed", "ProtocolError: unexpected reply 'opaque'")


def test_a_loop_is_stopped_by_the_cpu_limit():
    res = check("def remove_occ(s, ch):\n    while True:\n        pass\n")
    assert outcome(res) == (False, "timeout", "CPU limit of 1 s")
    res = check("import time\ntime.sleep(3600)\n", wall_timeout=2)
    assert outcome(res) == (False, "timeout", "wall-clock limit of 2 s")


def test_huge_outputs_neither_block_nor_cross():
    # 64 MiB printed to stdout and stderr before answering: nothing reads them, nothing blocks
    prints = ("import sys\nsys.stdout.write('x' * (64 << 20))\nsys.stderr.write('x' * (64 << 20))\n"
              "def remove_occ(s, ch):\n    print('y' * (64 << 20))\n    return s\n")
    assert outcome(check(prints)) == (False, "failed", "AssertionError (assert 1 of 3)")
    # a result over the frame limit is refused in the candidate's process
    huge = "def remove_occ(s, ch):\n    return 'heo' + ' ' * (40 << 20)\n"
    assert outcome(check(huge)) == (
        False, "failed", "TypeError: the result cannot cross: message of 41943057 bytes is over "
                         "the 33554432 byte limit (assert 1 of 3)")
