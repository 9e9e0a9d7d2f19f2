"""The worker process of :mod:`.chat_render`: renders chat templates with transformers' own
renderer, one request at a time, under the address-space limit its parent set.

Run as a script (``python chat_worker.py MAX_CHARS MEMORY_BYTES``), never imported by the
package: it limits its own address space first, then imports transformers' template utilities
only (no torch, no pvf_lmeval), so it starts small and fast.
Protocol on stdin/stdout: an 8-byte big-endian length, then that many bytes of UTF-8 JSON.
Request: ``{"template", "messages", "add_generation_prompt", "continue_final_message",
"special"}``; reply: ``{"text": ...}`` or ``{"error": "one line", "template_error": bool}``
(``template_error``: the template raised jinja2's ``TemplateError``, as templates that refuse a
message do).
"""

import json
import resource
import struct
import sys


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def _read(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


def main() -> None:
    max_chars, memory = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
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
