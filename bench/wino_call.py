"""The cost of one model call with WINO's shadow block against the same call without it.

On a fixture, for each held-out `arith` prompt's canvas (prompt + ``--gen-length`` masks) the
first block of ``--block-length`` positions is requested twice: by a plain call, and by a call
with ``shadow=Shadow(block start, block length)`` (the block's logits and its shadow rows). The
rows of a batch are the first ``--batch`` prompts, left-padded. Printed per batch size: the
median wall time of each call over ``--repeats`` after one warm-up, alternating the two so both
see the same machine, and their ratio.

    python bench/wino_call.py                          # tiny-llada, gen 256 / block 32, 1 thread
    python bench/wino_call.py --batch 1 8 --threads 2 --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from benchlib import Shadow, held_out, load_model, prompt_ids, sync


def canvases(model, n: int, gen_length: int):
    """(tokens [n, T], attention mask [n, T], first answer column): the first ``n`` prompts
    left-padded to the longest, followed by ``gen_length`` masks."""
    prompts = prompt_ids(model.tokenizer, held_out(n))
    width = max(len(p) for p in prompts)
    tokens = torch.full((n, width + gen_length), model.mask_id)
    keep = torch.ones(n, width + gen_length, dtype=torch.long)
    for r, p in enumerate(prompts):
        tokens[r, :width - len(p)] = model.pad_id
        keep[r, :width - len(p)] = 0
        tokens[r, width - len(p):width] = torch.tensor(p)
    return tokens.to(model.device), keep.to(model.device), width


def median_ms(calls, repeats: int, device) -> list[float]:
    """Median wall milliseconds of each of ``calls`` (alternated, after one warm-up each)."""
    for call in calls:
        call()
    times = [[] for _ in calls]
    for _ in range(repeats):
        for call, out in zip(calls, times):
            sync(device)
            t0 = time.perf_counter()
            call()
            sync(device)
            out.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default="tiny-llada")
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-invariant", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(a.fixture, device=a.device, dtype="float32")
    print(f"{a.fixture}, gen {a.gen_length} / block {a.block_length}, {a.threads} thread(s), "
          f"{a.device}, batch_invariant={a.batch_invariant}, median of {a.repeats}")
    print("| batch | canvas | plain ms | shadow ms | shadow / plain |")
    print("|---|---|---|---|---|")
    for n in a.batch:
        tokens, keep, start = canvases(model, n, a.gen_length)
        block = torch.arange(start, start + a.block_length, device=tokens.device)
        shadow = Shadow(torch.full((n,), start, device=tokens.device), a.block_length)

        def plain():
            model.logits(tokens, block, attention_mask=keep)

        def shadowed():
            model.logits(tokens, block, attention_mask=keep, shadow=shadow)

        with model.batch_invariant() if a.batch_invariant else torch.no_grad():
            p, s = median_ms([plain, shadowed], a.repeats, model.device)
        print(f"| {n} | {tokens.shape[1]} | {p:.2f} | {s:.2f} | {s / p:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
