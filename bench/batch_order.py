"""Batches in the evaluator's order vs batches formed as lm-eval's HFLM forms them.

The held-out items of `arith` and `arith_var` (``--limit`` of each), in the evaluator's order
(task by task, documents in order), decoded in batches of ``--batch-size`` two ways: consecutive
requests (a new batch whenever the parameters change: the tasks' generation lengths differ), and
``pvf_lmeval.lmeval.batching.batches`` (grouped by parameters, longest prompt first). Reported
per way: the share of the batches' prompt columns that is left padding, wall seconds, answer
tokens per second (ratio of sums), and that both ways give the same tokens and NFE.

    python bench/batch_order.py --fixture tiny-llada --limit 32 --batch-size 8
"""

from __future__ import annotations

import argparse
import time

import torch

from benchlib import decode_batch, make_params, batches, padding_share, load_model

import benchlib


def evaluator_order(keys: list, batch_size: int) -> list[list[int]]:
    """Consecutive requests, a new batch whenever the key changes or the batch is full."""
    out: list[list[int]] = []
    for i, k in enumerate(keys):
        if out and keys[out[-1][0]] == k and len(out[-1]) < batch_size:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def run(model, prompts, params, order) -> tuple[float, list]:
    results = [None] * len(prompts)
    t0 = time.perf_counter()
    for b in order:
        outs = decode_batch(model, [prompts[i] for i in b], params=params[b[0]],
                            request_indices=b)
        for i, r in zip(b, outs):
            results[i] = r
    return time.perf_counter() - t0, results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", default="tiny-llada", choices=benchlib.FIXTURES)
    ap.add_argument("--decoder", default="threshold")
    ap.add_argument("--cache", default="none")
    ap.add_argument("--limit", type=int, default=32, help="items of each task")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.fixture, device=args.device)
    prompts, params = [], []
    for task in ("arith", "arith_var"):
        docs = benchlib.held_out(args.limit, task)
        p = make_params(args.decoder, gen_length=benchlib.TASKS[task][1],
                        block_length=args.block_length, cache=args.cache)
        prompts += benchlib.prompt_ids(model.tokenizer, docs)
        params += [p] * len(docs)
    lengths = [len(p) for p in prompts]
    ways = {"evaluator order": evaluator_order(params, args.batch_size),
            "grouped, longest first": batches(params, lengths, args.batch_size)}
    run(model, prompts[:2], params, [[0, 1]])                       # warm-up
    rows, outs = [], {}
    for name, order in ways.items():
        wall, res = run(model, prompts, params, order)
        outs[name] = [(r.tokens, r.nfe) for r in res]
        tokens = sum(r.gen_tokens for r in res)
        rows.append((name, len(order), padding_share(lengths, order), wall, tokens / wall))
    same = len({tuple(map(str, o)) for o in outs.values()}) == 1
    print(f"{args.fixture}, {args.decoder}, cache {args.cache}, {len(prompts)} requests "
          f"(arith + arith_var, {args.limit} each), batch {args.batch_size}, device "
          f"{args.device}, torch threads {torch.get_num_threads()}; same tokens and NFE: {same}")
    print("| batches | count | prompt padding share | wall s | tokens/s |")
    print("|---|---|---|---|---|")
    for name, n, pad, wall, tps in rows:
        print(f"| {name} | {n} | {100 * pad:.1f}% | {wall:.1f} | {tps:.1f} |")
    print(f"gain: {rows[1][4] / rows[0][4]:.2f}x tokens/s")


if __name__ == "__main__":
    main()
