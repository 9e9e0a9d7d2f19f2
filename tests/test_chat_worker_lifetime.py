"""The chat-template worker (``models/chat_render.py``) never outlives what it renders for: killed
with SIGTERM mid-render (as torchrun and SLURM stop a job), its parent takes the worker with it;
a worker whose parent died before it could ask for that exits at once; a render that raises in
the parent stops the worker; a worker busy past its CPU-time limit is killed by the kernel. Real
processes, watched through /proc (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.chat_parent import StubTokenizer, render

from pvf_lmeval.models import chat_render

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: a template that renders for ever (10^10 empty iterations)
LOOPS = ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
         "{{ messages[0]['content'] }}")
PARENT = Path(__file__).parent / "helpers" / "chat_parent.py"


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, CPU ticks used, start time) of process ``pid``; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()       # from field 3 (state) on
    return fields[0], int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])


def _workers(parent: int) -> dict[int, int]:
    """The running chat workers whose parent is ``parent``: pid -> start time."""
    out = {}
    for d in Path("/proc").iterdir():
        st = _stat(int(d.name)) if d.name.isdigit() else None
        if st is None or st[1] != parent or st[0] in "ZX":
            continue
        try:
            if b"chat_worker.py" in (d / "cmdline").read_bytes():
                out[int(d.name)] = st[3]
        except OSError:
            continue
    return out


def _alive(pid: int, start: int) -> bool:
    """Whether the process ``pid`` that started at ``start`` still runs (a zombie does not)."""
    st = _stat(pid)
    return st is not None and st[3] == start and st[0] not in "ZX"


def _wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _started(renderer) -> tuple[int, int]:
    """(pid, start time) of ``renderer``'s worker, started by a plain render."""
    before = _workers(os.getpid())
    assert render(renderer, StubTokenizer("<{{ messages[0]['content'] }}>")) == "<hi>"
    ((pid, start),) = {p: s for p, s in _workers(os.getpid()).items() if p not in before}.items()
    return pid, start


def test_a_parent_killed_mid_render_takes_its_worker_with_it():
    parent = subprocess.Popen([sys.executable, str(PARENT), LOOPS], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    worker = start = None
    try:
        assert parent.stdout.readline() == b"hi\n"     # the worker is started, and idle
        ((worker, start),) = _workers(parent.pid).items()
        idle = _stat(worker)[2]
        _wait_for(lambda: _stat(worker)[2] > idle + 10, 120, "the worker never began the render")
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(60) == -signal.SIGTERM
        _wait_for(lambda: not _alive(worker, start), 10, "the worker outlived its parent")
    finally:
        parent.kill()
        parent.wait()
        if worker is not None and _alive(worker, start):
            os.kill(worker, signal.SIGKILL)


def test_a_worker_whose_parent_died_before_it_started_exits_without_a_word():
    # the parent that started it is gone (the worker was re-parented before it could ask to
    # die with it): here, a worker told to expect another parent than the process it has
    others = os.getppid()
    done = subprocess.run([sys.executable, chat_render._WORKER, str(chat_render.MAX_CHARS),
                           str(chat_render.WORKER_MEMORY), str(chat_render.CPU_LIMIT), str(others)],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, b"")


def test_a_render_that_raises_in_the_parent_stops_the_worker(monkeypatch):
    """An exception in the parent mid-render (here from a signal handler, as a program that turns
    SIGTERM or SIGINT into an exception gets) leaves no worker rendering on."""
    class Interrupted(BaseException):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    monkeypatch.setattr(chat_render, "TIME_LIMIT", 600.0)
    renderer = chat_render.ChatRenderer()
    pid, start = _started(renderer)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted):
            render(renderer, StubTokenizer(LOOPS))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not _alive(pid, start)
    assert render(renderer, StubTokenizer("<{{ messages[0]['content'] }}>")) == "<hi>"  # afresh


def test_a_worker_busy_past_its_cpu_time_limit_is_killed(monkeypatch):
    # the wall-time limit far away: only the CPU-time limit can stop this render
    monkeypatch.setattr(chat_render, "TIME_LIMIT", 120.0)
    monkeypatch.setattr(chat_render, "CPU_LIMIT", 1)
    renderer = chat_render.ChatRenderer()
    pid, start = _started(renderer)
    with pytest.raises(ValueError) as err:
        render(renderer, StubTokenizer(LOOPS))
    assert str(err.value) == ("pvf-dlm: the chat template of 'm' used more than 1 s of CPU time "
                              "(a loop that does not end?)")
    assert not _alive(pid, start)
    assert render(renderer, StubTokenizer("<{{ messages[0]['content'] }}>")) == "<hi>"  # afresh
