"""Does a checkpoint live in the planning regime? Threshold decoding on held-out items, counting
per request the positions that ever sit in the planning band with a structural (non-digit) top
token, and the model calls threshold needs.

For each request: threshold decoding (tau 0.9, blocks of ``--block-length``, the most confident
position forced when none clears tau, early stop at the first end-of-text with everything before
it decoded). At every call, the masked positions of the current block whose top probability lies
in ``[band_lo, band_hi)`` and whose top token is neither a digit-bearing nor an end token are
*band events*; a position counted once per request is a *band position*. Prints the means per
request and the share of band positions that are structural.

    python bench/regime_check.py --model /tmp/train-var/tiny-llada --task arith_var --limit 32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchlib import load_model

import benchlib


@torch.no_grad()
def decode_one(model, prompt, gen_length, block, tau, band, structural):
    """Threshold decoding of one prompt -> (tokens, calls, band events, band positions,
    structural band positions)."""
    mask = model.mask_id
    canvas = torch.tensor(prompt + [mask] * gen_length, device=model.device)[None]
    start = len(prompt)
    calls, events, band_pos, struct_pos = 0, 0, set(), set()
    eos = torch.tensor(model.eos_ids, device=model.device)
    for b0 in range(start, start + gen_length, block):
        pos = torch.arange(b0, b0 + block, device=model.device)
        while True:
            still = canvas[0, pos] == mask
            if not still.any():
                break
            logits = model.logits(canvas, pos)[0].float()
            logits[:, mask] = float("-inf")
            logits[:, len(structural):] = float("-inf")     # undecodable head ids
            conf, top = logits.softmax(-1).max(-1)
            calls += 1
            in_band = still & (conf >= band[0]) & (conf < band[1])
            events += int(in_band.sum())
            for i in in_band.nonzero().flatten().tolist():  # bookkeeping only, few per call
                band_pos.add(b0 + i)
                if structural[top[i]]:
                    struct_pos.add(b0 + i)
            pick = still & (conf >= tau)
            if not pick.any():
                pick = torch.zeros_like(still)
                pick[conf.masked_fill(~still, -1).argmax()] = True
            canvas[0, pos] = torch.where(pick, top, canvas[0, pos])
            gen = canvas[0, start:]
            ends = torch.isin(gen, eos).nonzero().flatten()
            if len(ends) and not (gen[:ends[0]] == mask).any():
                canvas[0, start + ends[0]:] = gen[ends[0]]
                return canvas[0, start:].tolist(), calls, events, len(band_pos), len(struct_pos)
    return canvas[0, start:].tolist(), calls, events, len(band_pos), len(struct_pos)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint folder or bundled name")
    ap.add_argument("--task", default="arith_var", choices=list(benchlib.TASKS))
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--band", default="0.2:0.65")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    band = tuple(float(x) for x in args.band.split(":"))
    model = load_model(args.model, dtype="float32")
    tok = model.tokenizer
    n_vocab = len(tok)
    structural = []
    for i in range(n_vocab):
        s = tok.decode([i])
        structural.append(i not in model.eos_ids and not any(c.isdigit() for c in s))
    structural = torch.tensor(structural)
    docs = benchlib.held_out(args.limit, task=args.task)
    prompts = benchlib.prompt_ids(tok, docs)
    extract = benchlib.extract_answer(args.task)
    tot = {"calls": 0, "events": 0, "band_positions": 0, "structural_band_positions": 0, "correct": 0}
    for d, p in zip(docs, prompts):
        ids, calls, events, bp, sp = decode_one(model, p, args.gen_length, args.block_length, 0.9,
                                                band, structural)
        cut = next((k for k, t in enumerate(ids) if t in model.eos_ids), len(ids))
        tot["correct"] += extract(tok.decode(ids[:cut], skip_special_tokens=True)) == d["target"]
        tot["calls"] += calls
        tot["events"] += events
        tot["band_positions"] += bp
        tot["structural_band_positions"] += sp
    n = len(docs)
    out = {"model": args.model, "task": args.task, "items": n, "gen_length": args.gen_length,
           "block_length": args.block_length, "band": list(band),
           **{f"{k}_per_request": round(v / n, 2) for k, v in tot.items() if k != "correct"},
           "accuracy": round(tot["correct"] / n, 3)}
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
