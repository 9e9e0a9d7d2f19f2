"""The effect of each ``rules=reference`` switch on the tiny fixtures' held-out `arith` items.

For each fixture: ``pvf`` (the `arith` preset, vocab=auto as the adapter resolves it) under the
paper's rules, under the paper's rules plus one switch at a time, and under ``rules=reference``;
and ``threshold`` with Fast-dLLM's factor rule (factor 1) under both rule sets. Columns:
accuracy (± standard error), mean NFE, mean branch rows, tokens per forward, committed tokens per
route, and the change in NFE and accuracy against the paper's rules on the same items. The
reference's own loops have no early stop, so ``--early-stop off`` (the default here) matches
them; ``--early-stop on`` measures our default setting. Prints one Markdown table.

    python bench/rules.py --limit 300
"""

from __future__ import annotations

import argparse
import math

import torch

from benchlib import (decode_batch, make_params, SWITCHES, rules_for, load_model, capitalised_ids,
                      resolve_vocab_for)

import benchlib

PVF_SWITCHES = [s for s in SWITCHES if s != "factor_last_rank_commits_all"]


def configs(switches: bool = True):
    """(decoder, rules, extra params) rows, the paper's rules first for each decoder; without
    ``switches`` only the two rule sets."""
    rows = [("pvf", "paper", {"preset": "arith"})]
    rows += [("pvf", s, {"preset": "arith"}) for s in (PVF_SWITCHES if switches else ())]
    rows += [("pvf", "reference", {"preset": "arith"}),
             ("threshold", "paper", {"factor": 1.0}),
             ("threshold", "reference", {"factor": 1.0})]
    return rows


def run(model, prompts, targets, extract, decoder, rules, extra, args, caps):
    extra = dict(extra)
    preset = extra.pop("preset", None)
    kw = dict(gen_length=args.gen_length, block_length=args.block_length,
              early_stop=args.early_stop == "on", rules=rules, **extra)
    params = make_params(decoder, preset=preset, **kw)
    if decoder == "pvf":
        ids, _ = resolve_vocab_for(model, task_family=params.family)
        if rules_for(rules).capitalised_plan_tokens:      # what the adapter adds (switch 2)
            ids = tuple(sorted(set(ids or ()) | caps))
        params = make_params(decoder, preset=preset, plan_vocab=ids, **kw)
    eos = set(model.eos_ids)
    correct = nfe = rows = gen = 0
    routes = {"plan": 0, "ar": 0, "forced": 0}
    for b0 in range(0, len(prompts), args.batch_size):
        chunk = prompts[b0:b0 + args.batch_size]
        for k, r in enumerate(decode_batch(model, chunk, params=params,
                                           request_indices=list(range(b0, b0 + len(chunk))))):
            toks = r.tokens[:next((i for i, t in enumerate(r.tokens) if t in eos), len(r.tokens))]
            correct += extract(model.tokenizer.decode(toks)) == targets[b0 + k]
            nfe, rows, gen = nfe + r.nfe, rows + r.branch_rows, gen + r.gen_tokens
            for name in routes:
                routes[name] += getattr(r, f"tokens_{name}")
    n = len(prompts)
    acc = correct / n
    return dict(acc=acc, se=math.sqrt(acc * (1 - acc) / n), nfe=nfe / n, rows=rows / n,
                tpf=gen / nfe, **{k: v / n for k, v in routes.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_arguments(ap, limit_default=300)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--early-stop", choices=("on", "off"), default="off")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-switches", action="store_true",
                    help="only rules=paper and rules=reference (no single-switch rows)")
    ap.add_argument("--no-header", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    docs = benchlib.held_out(args.limit)
    extract = benchlib.extract_answer()
    targets = [d["target"] for d in docs]
    if not args.no_header:
        print(f"held-out arith items: {len(docs)}, gen_length {args.gen_length}, block "
              f"{args.block_length}, greedy, cache=none, early_stop={args.early_stop}\n")
        print("| fixture | decoder | rules | accuracy ± s.e. | Δacc (pts) | NFE | ΔNFE "
              "| branch rows | TPF | plan tok | AR tok | forced tok |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fixture in args.fixtures:
        model = load_model(fixture, device="cpu")
        prompts = benchlib.prompt_ids(model.tokenizer, docs)
        caps = capitalised_ids(model.tokenizer)
        base = {}
        for decoder, rules, extra in configs(not args.no_switches):
            m = run(model, prompts, targets, extract, decoder, rules, extra, args, caps)
            ref = base.setdefault(decoder, m)
            d_acc = "" if m is ref else f"{100 * (m['acc'] - ref['acc']):+.1f}"
            d_nfe = "" if m is ref else f"{m['nfe'] / ref['nfe']:.3f}x"
            print(f"| {fixture} | {decoder}{' factor=1' if 'factor' in extra else ''} | {rules} "
                  f"| {100 * m['acc']:.1f}% ± {100 * m['se']:.1f} | {d_acc} | {m['nfe']:.2f} "
                  f"| {d_nfe} | {m['rows']:.2f} | {m['tpf']:.2f} | {m['plan']:.2f} "
                  f"| {m['ar']:.2f} | {m['forced']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
