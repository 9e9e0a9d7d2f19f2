"""A time and memory bound for tests of hostile files: a file must fail fast and small."""

from __future__ import annotations

import resource
import signal
from contextlib import contextmanager

GiB = 1 << 30


@contextmanager
def bounded(seconds: int = 60, extra_bytes: int = GiB):
    """Fail the block if it runs longer than ``seconds`` or raises the process's peak resident
    memory by ``extra_bytes`` or more."""
    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grew < extra_bytes, f"peak memory grew by {grew} bytes"
