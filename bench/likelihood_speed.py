"""Log-likelihood requests: the batched path against the one-request path, in the same run.

Two multiple-choice tasks built from the held-out `arith` items on a bundled model:

- ``answers``: each item's whole solution and the same solution with a wrong final result
  (50-70 tokens each; two choices per item);
- ``numbers``: the solution up to its ``#### ``, then four candidate results (one or two tokens
  each; four choices per item), the usual shape of a multiple-choice answer.

The one-request path (what ``loglikelihood`` did before): per continuation, ``elbo`` with
``mc_batch`` draws per model call, plus one forward for the old one-step greedy check. The
batched path: ``loglikelihoods`` over ``--batch-size`` continuations at a time (calls of at most
batch size x ``mc_batch`` distinct canvases) plus ``greedy_matches`` (one decode per distinct
prefix). Printed per task: seconds of each path, their ratio, and the largest difference of
the estimates; then, with ``batch_invariant``, whether every draw is bit-identical.

    python bench/likelihood_speed.py [--fixture tiny-llada] [--limit 8] [--mc-num 128]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchlib import (held_out, make_params, invariant_mode, Continuation, elbo, elbo_batch,
                      greedy_matches, loglikelihoods, load_model)


def tasks(tokenizer, docs) -> dict[str, list[Continuation]]:
    """The two tasks' continuations (the choices of an item share its seed key)."""
    def enc(text):
        return tokenizer.encode(text, add_special_tokens=False)

    answers, numbers = [], []
    for key, d in enumerate(docs):
        prompt = f"Question: {d['question']}\nAnswer:"
        n = int(d["target"])
        wrong = n + 1 if len(str(n + 1)) == len(str(n)) else n - 1
        lines = d["answer"].split("\n")
        bad = lines[:-2] + [lines[-2].replace(f" {n} ", f" {wrong} "), f"#### {wrong}"]
        for solution in (d["answer"], "\n".join(bad)):
            ctx = enc(prompt)
            answers.append(Continuation(ctx, enc(prompt + " " + solution)[len(ctx):], key))
        head = prompt + " " + d["answer"].rsplit("#### ", 1)[0] + "####"
        ctx = enc(head)
        for guess in (n, n + 1, n + 2, max(n - 1, 0) if n else n + 3):
            numbers.append(Continuation(ctx, enc(f"{head} {guess}")[len(ctx):], 1000 + key))
    return {"answers": answers, "numbers": numbers}


def one_request_path(model, items, mc_num, mc_batch, fixed):
    """Per continuation: ``elbo`` and the one-step greedy forward (prefix + masks)."""
    out = []
    for it in items:
        draws, _ = elbo(model, it.prefix, it.target, mc_num=mc_num, mc_batch=mc_batch,
                        request_index=it.key, fixed=fixed)
        row = torch.tensor([*it.prefix, *[model.mask_id] * len(it.target)])
        model.logits(row[None], torch.arange(len(it.prefix), len(row)))
        out.append(draws)
    return out


def batched_path(model, items, mc_num, mc_batch, batch_size, params):
    out = []
    for a in range(0, len(items), batch_size):
        chunk = items[a:a + batch_size]
        out += [r.draws for r in loglikelihoods(model, chunk, mc_num=mc_num,
                                                rows_per_call=batch_size * mc_batch)]
        greedy_matches(model, [c.prefix for c in chunk], [c.target for c in chunk], params,
                       keys=[c.key for c in chunk], batch_size=batch_size)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default="tiny-llada")
    ap.add_argument("--limit", type=int, default=8, help="held-out arith items")
    ap.add_argument("--mc-num", type=int, default=128)
    ap.add_argument("--mc-batch", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--gen-length", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--invariant-mc-num", type=int, default=16,
                    help="mc_num of the bit-for-bit check under batch_invariant")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.fixture, device="cpu")
    params = make_params("threshold", gen_length=args.gen_length, block_length=32)
    print(f"{args.fixture}, {args.limit} items, mc_num {args.mc_num}, mc_batch {args.mc_batch}, "
          f"batch size {args.batch_size}, {torch.get_num_threads()} threads")
    print("| task | continuations | tokens each | one-request s | batched s | ratio | "
          "max abs diff | bit-identical (batch_invariant) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, items in tasks(model.tokenizer, held_out(args.limit)).items():
        with torch.inference_mode():
            t0 = time.perf_counter()
            old = one_request_path(model, items, args.mc_num, args.mc_batch, False)
            t1 = time.perf_counter()
            new = batched_path(model, items, args.mc_num, args.mc_batch, args.batch_size, params)
            t2 = time.perf_counter()
            diff = max(float((a - b).abs().max()) for a, b in zip(old, new))
            with invariant_mode(model, True):
                ref = [elbo(model, it.prefix, it.target, mc_num=args.invariant_mc_num,
                            mc_batch=args.mc_batch, request_index=it.key, fixed=True)[0]
                       for it in items]
                got, _ = elbo_batch(model, items, mc_num=args.invariant_mc_num,
                                    rows_per_call=args.batch_size * args.mc_batch, fixed=True)
            same = all(torch.equal(a, b) for a, b in zip(ref, got))
        lengths = sorted(len(it.target) for it in items)
        print(f"| {name} | {len(items)} | {lengths[0]}-{lengths[-1]} | {t1 - t0:.1f} | "
              f"{t2 - t1:.1f} | {(t1 - t0) / (t2 - t1):.1f}x | {diff:.2e} | {same} |")


if __name__ == "__main__":
    main()
