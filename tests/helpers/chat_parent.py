"""A process that renders chat templates through its own :class:`ChatRenderer`, for tests of the
worker's lifetime: run as ``python chat_parent.py TEMPLATE``, it renders a plain template (the
worker is then started and idle), prints the result, then renders ``TEMPLATE`` with the time
and CPU limits lifted, so that only its own death can stop a worker caught in a loop."""

from __future__ import annotations

import sys


class StubTokenizer:
    """What the renderer reads of a tokenizer: its template and special tokens."""

    special_tokens_map: dict = {}

    def __init__(self, template: str):
        self.template = template

    def get_chat_template(self, name=None) -> str:
        return self.template


def render(renderer, tok: StubTokenizer) -> str:
    return renderer.render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True,
                           continue_final_message=False, where="'m'")


if __name__ == "__main__":
    from pvf_lmeval.models import chat_render

    chat_render.TIME_LIMIT, chat_render.CPU_LIMIT = 3600.0, 3600
    renderer, tok = chat_render.ChatRenderer(), StubTokenizer("{{ messages[0]['content'] }}")
    print(render(renderer, tok), flush=True)
    tok.template = sys.argv[1]
    render(renderer, tok)
