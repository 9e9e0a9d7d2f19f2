"""Log-likelihood requests at the CLI's defaults: what ``is_greedy`` costs, and what it no longer
costs where lm-eval does not read it.

Two task shapes built from the held-out `arith` items on a bundled model:

- ``answers``: each item's whole solution and the same solution with a wrong final result
  (50-70 tokens each; two continuations per item);
- ``numbers``: the solution up to its ``#### ``, then four candidate results (one or two tokens
  each; four continuations per item), the usual shape of a multiple-choice answer.

Each is scored three ways, with the settings a plain ``lm_eval --model pvf-dlm`` run has (read
from ``RunSettings.parse({})``: ``mc_num``, ``mc_batch``, ``batch_size`` and the decoder's
``gen_length``, unless given here):

- ``decode``: the ELBO plus ``is_greedy`` as the run's decoder's greedy generation (one
  temperature-0 decode at ``gen_length`` per distinct context), which every continuation paid
  whether lm-eval read it or not;
- ``multiple_choice``: the ELBO only (lm-eval reads no ``is_greedy`` there);
- ``loglikelihood``: the ELBO plus LLaDA's suffix greedy check (``suffix_greedy``), its first
  step read from the draws (what an ``output_type: loglikelihood`` task, lambada's, costs).

Printed per task: seconds of each way, the model calls of the greedy checks, the ratio of
``decode`` to ``multiple_choice``, and, under ``batch_invariant``, whether the batched estimates
equal the one-request ones bit for bit.

    python bench/likelihood_speed.py [--fixture tiny-llada] [--limit 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchlib import (held_out, invariant_mode, Continuation, Estimator, decode_batch, elbo,
                      elbo_batch, loglikelihoods, load_model, suffix_greedy)


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


def scored(model, items, est, mc_batch, batch_size):
    """The ELBO of ``items``, ``batch_size`` continuations per batch (the adapter's batching)."""
    out = []
    for a in range(0, len(items), batch_size):
        out += loglikelihoods(model, items[a:a + batch_size], estimator=est,
                              rows_per_call=batch_size * mc_batch)
    return out


def greedy_decodes(model, items, params, batch_size) -> None:
    """``is_greedy`` as the decoder's generation: one temperature-0 decode at ``gen_length`` per
    distinct context, ``batch_size`` contexts per batch."""
    contexts = list(dict.fromkeys(tuple(it.prefix) for it in items))
    for a in range(0, len(contexts), batch_size):
        decode_batch(model, [list(c) for c in contexts[a:a + batch_size]], params=params,
                     temperature=0.0)


def greedy_checks(model, items, scores, est, mc_batch, batch_size) -> int:
    """LLaDA's suffix greedy check where the draws did not decide it; its model calls."""
    calls = 0
    for a in range(0, len(items), batch_size):
        todo = [j for j in range(a, min(a + batch_size, len(items)))
                if scores[j].is_greedy is None]
        got = suffix_greedy(model, [items[j] for j in todo],
                            [scores[j].greedy_first for j in todo], estimator=est,
                            rows_per_call=batch_size * mc_batch)
        calls += sum(g.calls for g in got)
    return calls


def main(argv=None) -> None:
    from benchlib import RunSettings

    cli = RunSettings.parse({})
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default="tiny-llada")
    ap.add_argument("--limit", type=int, default=8, help="held-out arith items")
    ap.add_argument("--mc-num", type=int, default=cli.options.mc_num)
    ap.add_argument("--mc-batch", type=int, default=cli.options.mc_batch)
    ap.add_argument("--batch-size", type=int, default=cli.options.batch_size)
    ap.add_argument("--gen-length", type=int, default=None,
                    help="the greedy decode's canvas (default: the CLI's gen_length)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--invariant-mc-num", type=int, default=16,
                    help="mc_num of the bit-for-bit check under batch_invariant")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.fixture, device="cpu")
    params = cli.decoding.params(getattr(model, "block_size", None))
    if args.gen_length is not None:
        from benchlib import make_params

        params = make_params(params.decoder, gen_length=args.gen_length,
                             block_length=params.block_length)
    est = Estimator(mc_num=args.mc_num)
    print(f"{args.fixture}, {args.limit} items, mc_num {args.mc_num}, mc_batch {args.mc_batch}, "
          f"batch size {args.batch_size}, {params.decoder} gen_length {params.gen_length} "
          f"block_length {params.block_length}, {torch.get_num_threads()} threads")
    print("| task | continuations | tokens each | decode s | multiple_choice s | "
          "loglikelihood s | greedy-check calls | decode / multiple_choice | "
          "bit-identical (batch_invariant) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, items in tasks(model.tokenizer, held_out(args.limit)).items():
        with torch.inference_mode():
            t0 = time.perf_counter()
            scored(model, items, est, args.mc_batch, args.batch_size)
            greedy_decodes(model, items, params, args.batch_size)
            t1 = time.perf_counter()
            scored(model, items, est, args.mc_batch, args.batch_size)
            t2 = time.perf_counter()
            scores = scored(model, items, est, args.mc_batch, args.batch_size)
            calls = greedy_checks(model, items, scores, est, args.mc_batch, args.batch_size)
            t3 = time.perf_counter()
            small = Estimator(mc_num=args.invariant_mc_num)
            with invariant_mode(model, True):
                ref = [elbo(model, it.prefix, it.target, estimator=small, mc_batch=args.mc_batch,
                            request_index=it.key, fixed=True)[0] for it in items]
                got = elbo_batch(model, items, estimator=small,
                                 rows_per_call=max(args.batch_size, 16) * args.mc_batch,
                                 fixed=True)
            same = all(torch.equal(a, b.draws) for a, b in zip(ref, got))
        lengths = sorted(len(it.target) for it in items)
        print(f"| {name} | {len(items)} | {lengths[0]}-{lengths[-1]} | {t1 - t0:.1f} | "
              f"{t2 - t1:.1f} | {t3 - t2:.1f} | {calls} | {(t1 - t0) / (t2 - t1):.1f}x | "
              f"{same} |")


if __name__ == "__main__":
    main()
