"""Planning vocabularies side by side: none, heuristic, hand-written, calibrated, online.

On the held-out `arith` (or `arith_var`: --task) set of each tiny fixture, PVF (`arith` preset: the paper's math-word
defaults) with the planning vocabulary from:

    none               planning off (the AR fallback still runs)
    heuristic          the family's uncalibrated 8B heuristic artifact, resolved by string
    hand-written       the fixture's hand-written artifact
    calibrated         the fixture's pvf-calibrate artifact
    online cold p1/p2  vocab=online from empty statistics: first pass over the set (learning as
                       it goes), then a second pass continuing from the first pass's statistics
    online seeded      vocab=online seeded from the calibrated artifact, one pass

Online statistics are updated between requests (batch size 1; --batch to change), in the set's
order. The other rows decode --batch-size requests together (same outputs and NFE). Per row: accuracy, mean NFE, mean branch rows, share of committed tokens from the planning
route, planning verification pass rate (verified candidates passing / tried), eligible vocabulary
size at the end, wall ms per request. Also measures the extra cost of the entropies the online
mode computes in its planning calls (same rows, with and without them).

    python bench/vocab_modes.py                        # both fixtures, all 1,000 items
    python bench/vocab_modes.py --limit 200 --fixtures tiny-llada
    python bench/vocab_modes.py --task arith_var --batch-size 32 --only none heuristic hand-written calibrated
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from benchlib import (decode, decode_batch, make_params, OnlineVocab, load_model,
                      vocab_artifacts_dir, artifact_statistics, load_artifact, resolve_artifact)

import benchlib

HEURISTIC = {"llada": "llada-8b-instruct", "dream": "dream-v0-instruct-7b"}


def _outputs(model, prompts, params, online, batch, batch_size, tot):
    """Decoded outputs in order: one at a time with online statistics (updated every ``batch``
    requests), else ``batch_size`` requests per batched call."""
    if online is None and batch_size > 1:
        for b0 in range(0, len(prompts), batch_size):
            t0 = time.perf_counter()
            outs = decode_batch(model, prompts[b0:b0 + batch_size], params=params,
                                request_indices=list(range(b0, b0 + len(prompts[b0:b0 + batch_size]))))
            tot["wall"] += time.perf_counter() - t0
            yield from outs
        return
    for i, p in enumerate(prompts):
        if online is not None and i and i % batch == 0:
            online.update()
        t0 = time.perf_counter()
        out = decode(model, p, params=params, request_index=i, online=online)
        tot["wall"] += time.perf_counter() - t0
        yield out


def run_pass(model, prompts, targets, extract, params, online=None, batch=1, batch_size=1):
    eos = set(model.eos_ids)
    tot = dict(correct=0, nfe=0, rows=0, committed=0, plan=0, ar=0, tried=0, passed=0, wall=0.0)
    for out, target in zip(_outputs(model, prompts, params, online, batch, batch_size, tot), targets):
        ids = out.tokens
        cut = next((k for k, t in enumerate(ids) if t in eos), len(ids))
        tot["correct"] += extract(model.tokenizer.decode(ids[:cut], skip_special_tokens=True)) == target
        tot["nfe"] += out.nfe
        tot["rows"] += out.branch_rows
        tot["committed"] += out.committed
        tot["plan"] += out.tokens_plan
        tot["ar"] += out.tokens_ar
        tot["tried"] += out.plan_tried
        tot["passed"] += out.plan_passed
    if online is not None:
        online.update()
    n = len(prompts)
    acc = tot["correct"] / n
    return {"acc": acc, "se": math.sqrt(acc * (1 - acc) / n), "nfe": tot["nfe"] / n,
            "rows": tot["rows"] / n, "plan_share": tot["plan"] / max(tot["committed"], 1),
            "ar_share": tot["ar"] / max(tot["committed"], 1),
            "pass_rate": tot["passed"] / tot["tried"] if tot["tried"] else float("nan"),
            "tried": tot["tried"] / n, "wall_ms": 1000 * tot["wall"] / n}


def entropy_cost(model, prompts, params, reps=30):
    """ms per planning-shaped call (1 + width rows) with and without the entropies."""
    from benchlib import Batch
    from benchlib import Runner

    p = torch.tensor(prompts[0], device=model.device)
    b = Batch(model, [p], params, request_indices=[0], repeat_indices=[0])
    runner = Runner(model, b)
    rows = torch.full((1, 1 + params.width, b.L), b.mask_id, dtype=torch.long, device=p.device)
    n = torch.tensor([1 + params.width], device=p.device)
    out = {False: float("inf"), True: float("inf")}
    for _ in range(7):               # interleaved rounds; the fastest of each (shared CPUs)
        for flag in (False, True):
            t0 = time.perf_counter()
            for _ in range(reps):
                runner.call(rows, n, entropy=flag)
            out[flag] = min(out[flag], 1000 * (time.perf_counter() - t0) / reps)
    return {"call_ms": out[False], "call_ms_with_entropy": out[True],
            "overhead": out[True] / out[False] - 1}


def save_online(args, online, tok, model, name, label) -> None:
    if args.save_online is None:
        return
    from benchlib import online_artifact, save_artifact

    art = online_artifact(online, tok, model_family=model.family, task_family="math-word",
                          model_name=name)
    save_artifact(art, args.save_online / f"{name}.math-word.online-{label}.json")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_arguments(ap, task_option=True)
    ap.add_argument("--batch", type=int, default=1, help="online: requests between updates")
    ap.add_argument("--batch-size", type=int, default=1,
                    help="rows without online statistics: requests decoded together")
    ap.add_argument("--level", type=float, default=0.2, help="online: Beta lower-bound quantile")
    ap.add_argument("--explore", type=int, default=1, help="online: reserved exploration slots")
    ap.add_argument("--explore-max", type=int, default=30, help="online: events before exploration stops")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or auto")
    ap.add_argument("--only", nargs="+", default=None, help="row labels to run")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    ap.add_argument("--save-online", type=Path, default=None,
                    help="folder: write the learned online statistics as artifacts (for audit)")
    args = ap.parse_args(argv)
    benchlib.task_gen_length(args)
    torch.set_num_threads(args.threads)
    extract = benchlib.extract_answer(args.task)
    docs = benchlib.held_out(args.limit, task=args.task)
    print(f"{args.task} held-out items: {len(docs)}; gen_length {args.gen_length}, block_length "
          f"{args.block_length}; online: batch {args.batch}, level {args.level}, explore "
          f"{args.explore}, explore_max {args.explore_max}; torch threads "
          f"{torch.get_num_threads()}; device {args.device}, {args.dtype}\n", flush=True)
    header = ("| fixture | vocabulary | accuracy | ± s.e. | NFE | branch rows | plan share "
              "| plan pass rate | tried/request | eligible | ms/request |")
    lines = [header, "|" + "---|" * 11]
    raw = {}
    online_kw = dict(level=args.level, explore=args.explore, explore_max=args.explore_max)
    for name in args.fixtures:
        model = load_model(name, device=args.device, dtype=args.dtype)
        tok = model.tokenizer
        prompts = benchlib.prompt_ids(tok, docs)
        targets = [d["target"] for d in docs]
        base = make_params("pvf", preset="arith", gen_length=args.gen_length,
                           block_length=args.block_length)
        arts = vocab_artifacts_dir()
        art = {
            "heuristic": load_artifact(arts / f"{HEURISTIC[model.family]}.math-word.heuristic.json"),
            "hand-written": load_artifact(arts / f"{name}.math-word.hand-written.json"),
            "calibrated": load_artifact(arts / f"{name}.math-word.calibrated.json"),
        }
        ids = {k: resolve_artifact(a, tok, model.family) for k, a in art.items()}
        size = model.vocab_size
        results = {}

        def want(label):
            return args.only is None or label in args.only

        def row(label, params, online=None, eligible=None):
            r = run_pass(model, prompts, targets, extract, params, online, args.batch, args.batch_size)
            r["eligible"] = len(online.eligible_ids()) if online is not None else eligible
            results[label] = r
            print(f"{name} {label}: {r}", file=sys.stderr, flush=True)

        if want("none"):
            row("none", base, eligible=0)
        for k in ("heuristic", "hand-written", "calibrated"):
            if want(k):
                row(k, make_params("pvf", preset="arith", gen_length=args.gen_length,
                                   block_length=args.block_length, plan_vocab=ids[k]),
                    eligible=len(ids[k]))
        if want("online cold p1") or want("online cold p2"):
            ov = OnlineVocab(size, **online_kw)
            row("online cold p1", base, ov)
            save_online(args, ov, tok, model, name, "cold-p1")
            row("online cold p2", base, ov)
            save_online(args, ov, tok, model, name, "cold-p2")
        if want("online seeded"):
            ov = OnlineVocab(size, **online_kw)
            try:
                ov.seed(artifact_statistics(art["calibrated"], tok, model.family))
            except ValueError as exc:     # a calibration that measured (almost) nothing
                print(f"{name} online seeded: {exc}; starting cold", file=sys.stderr)
            results_seed_eligible = len(ov.eligible_ids())
            row("online seeded", base, ov)
            save_online(args, ov, tok, model, name, "seeded")
            results["online seeded"]["eligible_at_start"] = results_seed_eligible
        if want("_entropy_cost"):
            results["_entropy_cost"] = entropy_cost(model, prompts, base)
            print(f"{name} entropy cost: {results['_entropy_cost']}", file=sys.stderr, flush=True)
        for label, r in results.items():
            if label.startswith("_"):
                continue
            pr = "—" if math.isnan(r["pass_rate"]) else f"{r['pass_rate']:.3f}"
            lines.append(
                f"| {name} | {label} | {r['acc']:.3f} | {r['se']:.3f} | {r['nfe']:.2f} "
                f"| {r['rows']:.2f} | {r['plan_share']:.3f} | {pr} | {r['tried']:.2f} "
                f"| {r['eligible']} | {r['wall_ms']:.1f} |")
        raw[name] = results
    print("\n".join(lines))
    for name, results in raw.items():
        if "_entropy_cost" not in results:
            continue
        c = results["_entropy_cost"]
        print(f"\n{name}: a planning call of {1 + base.width} rows takes {c['call_ms']:.2f} ms, "
              f"{c['call_ms_with_entropy']:.2f} ms with the online mode's entropies "
              f"(+{100 * c['overhead']:.1f}%)")
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
