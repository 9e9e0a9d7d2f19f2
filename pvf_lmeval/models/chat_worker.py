"""The worker process of :mod:`.chat_render`: renders chat templates with transformers' own
renderer, one request at a time, under the limits its parent set.

Run as a script (``python chat_worker.py MAX_CHARS MEMORY_BYTES CPU_SECONDS PARENT_PID``), never
imported by the package. Before anything else it asks the kernel to kill it when its parent
dies (Linux's ``PR_SET_PDEATHSIG``: a parent killed mid-render, as torchrun and SLURM stop jobs
with SIGTERM, must not leave a template looping on) and exits with status 1, without a word, if
its parent is no longer ``PARENT_PID`` (the parent died before that request: the worker was
re-parented). It then limits its own address space and core dumps, and imports transformers'
template utilities only (no torch, no pvf_lmeval), so it starts small and fast. Each render may
use ``CPU_SECONDS`` more seconds of CPU time (the kernel counts whole seconds: up to one more);
past them the kernel ends the process with SIGXCPU, a limit that holds when no parent watches
the wall time.
Protocol on stdin/stdout: an 8-byte big-endian length, then that many bytes of UTF-8 JSON.
Request: ``{"template", "messages", "add_generation_prompt", "continue_final_message",
"special"}``; reply: ``{"text": ...}`` or ``{"error": "one line", "template_error": bool}``
(``template_error``: the template raised jinja2's ``TemplateError``, as templates that refuse a
message do).
"""

import json
import math
import os
import resource
import signal
import struct
import sys

#: prctl(2)'s option: the signal the process gets when its parent (thread) ends
PR_SET_PDEATHSIG = 1


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def _read(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


def _die_with(parent: int) -> None:
    """SIGKILL when the parent ends (Linux); exit 1 if it ended already (module docstring)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        sys.exit(1)


def _limit_cpu(seconds: int) -> None:
    """Let the next render use ``seconds`` more seconds of CPU time (module docstring)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def main() -> None:
    max_chars, memory, cpu_seconds, parent = map(int, sys.argv[1:5])
    _die_with(parent)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))    # SIGXCPU would dump one
    from jinja2.exceptions import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _send(stdout, {"ready": True})          # the parent times renders, not this start
    while True:
        try:
            (n,) = struct.unpack(">Q", _read(stdin, 8))
            req = json.loads(_read(stdin, n))
        except EOFError:
            return
        _limit_cpu(cpu_seconds)
        try:
            rendered, _ = render_jinja_template(
                conversations=[req["messages"]], chat_template=req["template"],
                add_generation_prompt=req["add_generation_prompt"],
                continue_final_message=req["continue_final_message"], **req["special"])
            text = rendered[0]
            reply = ({"text": text} if len(text) <= max_chars else
                     {"error": f"the rendered prompt has {len(text)} characters, more than "
                               f"{max_chars}"})
        except MemoryError:
            reply = {"error": "it needs more memory than the renderer's limit"}
        except Exception as exc:  # noqa: BLE001  (a template's own error, reported in one line)
            reply = {"error": _one_line(exc), "template_error": isinstance(exc, TemplateError)}
        _send(stdout, reply)


def _send(stdout, reply: dict) -> None:
    out = json.dumps(reply).encode()
    stdout.write(struct.pack(">Q", len(out)) + out)
    stdout.flush()


if __name__ == "__main__":
    main()
