"""Decoding-trace records: one JSON object per request, as ``pvf-trace`` reads them.

The record's fields are described in :mod:`pvf_lmeval.cli.trace`.
"""

from __future__ import annotations

PROMPT_TAIL_CHARS = 300


def shown_length(routes: list) -> int:
    """Positions worth spelling out: up to the last position the decoder committed itself."""
    last = max((i for i, r in enumerate(routes) if r is not None), default=-1)
    return last + 1


def token_pieces(ids, tokenizer) -> list[str]:
    """Decoded text of each id on its own (special tokens kept)."""
    cache: dict[int, str] = {}
    out = []
    for t in ids:
        t = int(t)
        if t not in cache:
            try:
                cache[t] = tokenizer.decode([t], skip_special_tokens=False)
            except Exception:  # ids outside the tokenizer: show the id
                cache[t] = f"<{t}>"
        out.append(cache[t])
    return out


def trace_record(result, *, request: str, prompt_ids, tokenizer=None, model: str | None = None,
                 block_length: int | None = None) -> dict:
    """The JSONL record of one ``DecodeResult`` decoded with ``trace=True``."""
    prompt_ids = [int(t) for t in prompt_ids]
    rec = {"request": request, "decoder": result.decoder, "model": model,
           "prompt_ids": prompt_ids, "tokens": list(result.tokens), "routes": list(result.routes),
           "nfe": result.nfe, "gen_tokens": result.gen_tokens, "gen_length": result.gen_length,
           "block_length": block_length,
           "n_steps": len(result.steps) if result.steps is not None else None}
    if tokenizer is not None:
        n = shown_length(result.routes)
        rec["pieces"] = token_pieces(result.tokens[:n], tokenizer)
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        rec["prompt_text"] = text[-PROMPT_TAIL_CHARS:]
    rec["steps"] = result.steps
    return rec


