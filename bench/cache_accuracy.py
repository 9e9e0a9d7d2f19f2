"""Accuracy of every decoder per KV cache mode on the held-out `arith` items of the tiny
fixtures, against ``cache=none``: accuracy, its standard error, mean NFE and branch rows, and
whether each cached mode stays within one standard error of ``cache=none`` (the condition a
cache mode must meet to be offered; docs/benchmarks.md, "Batched decoding").

    python bench/cache_accuracy.py --limit 200 --caches none dual dual_base
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchlib import DECODER_NAMES, load_model

import benchlib
from decoders import run_config


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_arguments(ap, limit_default=200)
    ap.add_argument("--decoders", nargs="+", default=list(DECODER_NAMES))
    ap.add_argument("--caches", nargs="+", default=["none", "dual", "dual_base"])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    docs = benchlib.held_out(args.limit)
    extract = benchlib.extract_answer()
    targets = [d["target"] for d in docs]
    out = []
    print(f"{len(docs)} held-out arith items, gen_length {args.gen_length}, block_length "
          f"{args.block_length}; pvf and explore with the arith preset and vocab=auto\n")
    print("| fixture | decoder | cache | accuracy | s.e. | vs none | within 1 s.e. | NFE | rows |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.fixtures:
        model = load_model(name, device="cpu")
        prompts = benchlib.prompt_ids(model.tokenizer, docs)
        for dec in args.decoders:
            extra = {"preset": "arith"} if dec in ("pvf", "explore") else {}
            ref = None
            for cache in args.caches:
                r = run_config(model, prompts, targets, extract, dec, dict(extra, cache=cache),
                               args.gen_length, args.block_length, args.batch_size)
                ref = ref or r
                d = r["acc"] - ref["acc"]
                ok = abs(d) <= ref["se"] + 1e-12
                out.append({"fixture": name, "decoder": dec, "cache": cache, **r,
                            "delta": d, "within_se": ok})
                print(f"| {name} | {dec} | {cache} | {100 * r['acc']:.1f}% | "
                      f"{100 * r['se']:.1f} | {100 * d:+.1f} | {'yes' if ok else '**no**'} | "
                      f"{r['nfe']:.2f} | {r['rows']:.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
