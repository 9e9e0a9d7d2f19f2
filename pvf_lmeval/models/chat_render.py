"""A checkpoint's chat template, rendered with a time, memory and output limit.

A chat template is a program from the checkpoint folder. transformers renders it in jinja's
sandbox, which keeps it from Python's internals but not from running forever (nested loops) or
building a string of any size (``'x' * N``). :class:`ChatRenderer` therefore renders in a worker
process (``chat_worker.py``, transformers' own renderer, started once per process and shared)
under an address-space limit (:data:`WORKER_MEMORY`); a render that takes longer than
:data:`TIME_LIMIT` seconds kills the worker (the next render starts a fresh one), and a prompt
longer than :data:`MAX_CHARS` characters is refused. Every failure is a one-line ``ValueError``.

The worker never renders on for nobody: it dies with the thread that started it (Linux's
``PR_SET_PDEATHSIG``: a parent killed with SIGTERM mid-render, as torchrun and SLURM stop jobs,
takes it along; a worker whose parent died before it could ask for that exits at once), a
render may use :data:`CPU_LIMIT` seconds of CPU time (the kernel's limit, which holds when no
parent watches the wall time), and an exception in the parent while it waits for a render (an
interrupt) stops the worker before it propagates. A template's own error leaves the worker idle
and reused (lm-eval retries a template that refuses a system message without it).

The result is what ``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` returns: the
same renderer, the tokenizer's chosen template and its special tokens as the template's
variables.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

#: seconds one render may take (real templates take milliseconds; the first render compiles)
TIME_LIMIT = 20.0
#: seconds of CPU time one render may use (whole seconds, as the kernel counts them; one more
#: may pass): no more than the wall time, so that the parent's limit acts first while it lives
CPU_LIMIT = 20
#: seconds the worker may take to start (importing transformers), before any render is timed
START_LIMIT = 300.0
#: the worker's address space, bytes (it needs about 200 MiB)
WORKER_MEMORY = 1 << 30
#: the longest rendered prompt, characters
MAX_CHARS = 16 << 20
#: the longest reply read from the worker, bytes (JSON escapes at most 6 bytes per character)
_MAX_REPLY = 6 * MAX_CHARS + 1024
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_worker.py")


class TemplateRejected(ValueError):
    """The template itself refused the messages (jinja2's ``TemplateError``, e.g. a template
    that does not accept a system message): lm-eval's HFLM retries without the system role."""


class ChatRenderer:
    """Renders chat templates in one worker process (see the module docstring)."""

    def __init__(self):
        self._proc = None
        self._lock = threading.Lock()

    def _start(self):
        """The running worker, started (and its ready message awaited) if there is none."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, _WORKER, str(MAX_CHARS), str(WORKER_MEMORY), str(CPU_LIMIT),
                 str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            if self._reply(time.monotonic() + START_LIMIT) != {"ready": True}:
                raise EOFError
        return self._proc

    def _reply(self, deadline: float) -> dict:
        fd = self._proc.stdout.fileno()
        (n,) = struct.unpack(">Q", self._read(fd, 8, deadline))
        if n > _MAX_REPLY:
            raise EOFError
        return json.loads(self._read(fd, n, deadline))

    def _stop(self) -> int | None:
        """Kill and reap the worker; its exit status (negative: the signal that ended it), None
        without a worker."""
        if self._proc is None:
            return None
        self._proc.kill()           # a worker that died already keeps its own status
        code = self._proc.wait()
        self._proc = None
        return code

    def _read(self, fd: int, n: int, deadline: float) -> bytes:
        out = b""
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            block = os.read(fd, n - len(out))
            if not block:
                raise EOFError
            out += block
        return out

    def render(self, tokenizer, messages: list[dict], *, add_generation_prompt: bool,
               continue_final_message: bool, where: str, template: str | None = None) -> str:
        """``messages`` through ``tokenizer``'s chat template (``template``: the name of one of
        its named templates; None: its default); ``where`` names the model in errors."""
        request = json.dumps({
            "template": tokenizer.get_chat_template(template),
            "special": tokenizer.special_tokens_map,
            "messages": [{k: v for k, v in m.items() if v is not None} for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message}).encode()
        with self._lock:
            try:
                proc = self._start()
                proc.stdin.write(struct.pack(">Q", len(request)) + request)
                proc.stdin.flush()
                reply = self._reply(time.monotonic() + TIME_LIMIT)
            except TimeoutError:
                self._stop()
                raise ValueError(f"pvf-dlm: the chat template of {where} did not finish within "
                                 f"{TIME_LIMIT:g} s (a loop that does not end?)") from None
            except (EOFError, OSError, ValueError):
                # it died (a limit, a crash): the next render starts afresh
                if self._stop() == -signal.SIGXCPU:
                    raise ValueError(f"pvf-dlm: the chat template of {where} used more than "
                                     f"{CPU_LIMIT:g} s of CPU time (a loop that does not end?)"
                                     ) from None
                raise ValueError(f"pvf-dlm: the chat template of {where} could not be rendered "
                                 f"(its renderer stopped: over {WORKER_MEMORY >> 20} MiB?)") from None
            except BaseException:
                self._stop()       # the parent's own exception: no render goes on without it
                raise
        if "error" in reply:
            kind = TemplateRejected if reply.get("template_error") else ValueError
            raise kind(f"pvf-dlm: the chat template of {where} failed: {reply['error']}")
        return reply["text"]


#: the process's renderer (one worker, started on the first render)
RENDERER = ChatRenderer()
