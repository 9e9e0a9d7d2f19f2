"""Decoders side by side on the held-out `arith` (or `arith_var`) set of the tiny fixtures.

For each fixture and decoder: accuracy (with its standard error), mean NFE, mean branch rows,
tokens per forward (ratio of sums), planning and AR tokens and edits per request, wall seconds
per request, and NFE / wall-time ratios against `threshold` measured in the same run. Prints one
Markdown table.

    python bench/decoders.py                      # both fixtures, all 1,000 items
    python bench/decoders.py --limit 100 --fixtures tiny-llada
    python bench/decoders.py --task arith_var --batch-size 32 --slow-limit 200   # static, freedave
                                                                                 # on 200 items
    python bench/decoders.py --only freedave --skip-threshold --start 200 --json b.json  # items 200..
    python bench/decoders.py --merge a.json b.json   # one table from runs over consecutive items
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from benchlib import DECODERS, PLANNING_DECODERS, decode_batch, make_params, load_model, resolve_vocab_for

import benchlib

#: (label, decoder, extra params); pvf and pvf-edit rows use the `arith` preset (SPEC paper
#: defaults of the math-word family) and the fixture's bundled planning vocabulary (vocab=auto).
CONFIGS = [
    ("threshold", "threshold", {}),
    ("eb", "eb", {}),
    ("subblock", "subblock", {}),
    ("hierarchy", "hierarchy", {}),
    ("credit", "credit", {}),
    ("pvf", "pvf", {"preset": "arith"}),
    ("pvf routes=plan", "pvf", {"preset": "arith", "routes": "plan"}),
    ("pvf routes=ar", "pvf", {"preset": "arith", "routes": "ar"}),
    ("pvf routes=none", "pvf", {"preset": "arith", "routes": "none"}),
    ("explore pick=planning", "explore", {"preset": "arith", "pick": "planning"}),
    ("explore pick=random", "explore", {"preset": "arith", "pick": "random"}),
    ("static", "static", {}),
    ("freedave", "freedave", {}),
    ("wino", "wino", {}),
    ("joint", "joint", {}),
    ("joint preset=llada21-quality", "joint", {"preset": "llada21-quality"}),
    ("joint preset=llada21-speed", "joint", {"preset": "llada21-speed"}),
    ("pvf-edit", "pvf-edit", {"preset": "arith"}),
    ("pvf-edit edit_threshold=0.5", "pvf-edit", {"preset": "arith", "edit_threshold": 0.5}),
]
#: rows run only when --only names them: pvf with the published code's impact rule (switch 4
#: of rules=reference: the impact set covers W_t as it was before the base commit and an empty
#: one passes), which decides whether planning pays on the fixtures (docs/benchmarks.md, arith_var)
OPT_IN = [
    ("pvf rules=paper+impact_includes_committed", "pvf",
     {"preset": "arith", "rules": "paper+impact_includes_committed"}),
]
#: rows that cost the most on a CPU (static: gen_length calls per request); --slow-limit
SLOW = ("static", "freedave")


def run_config(model, prompts, targets, extract, decoder, extra, gen_length, block_length, batch_size):
    extra = dict(extra)
    preset = extra.pop("preset", None)
    params = make_params(decoder, preset=preset, gen_length=gen_length, block_length=block_length, **extra)
    if decoder in PLANNING_DECODERS:
        ids, _ = resolve_vocab_for(model, task_family=params.family)
        params = make_params(decoder, preset=preset, gen_length=gen_length, block_length=block_length,
                             plan_vocab=ids, **extra)
    eos = set(model.eos_ids)
    correct, nfe, rows, gen_tokens, wall = 0, 0, 0, 0, 0.0
    routes = {"plan": 0, "ar": 0}
    edits = 0
    outs = []
    for b0 in range(0, len(prompts), batch_size):
        chunk = prompts[b0:b0 + batch_size]
        t0 = time.perf_counter()
        # Batched decoding gives the same tokens and per-request NFE as one request at a time
        # (tests/test_batching.py); wall time is the batch's, shared equally.
        outs += decode_batch(model, chunk, params=params,
                             request_indices=list(range(b0, b0 + len(chunk))))
        wall += time.perf_counter() - t0
    for out, target in zip(outs, targets):
        ids = out.tokens
        cut = next((k for k, t in enumerate(ids) if t in eos), len(ids))
        text = model.tokenizer.decode(ids[:cut], skip_special_tokens=True)
        correct += extract(text) == target
        nfe += out.nfe
        rows += out.branch_rows
        gen_tokens += out.gen_tokens
        routes["plan"] += out.tokens_plan
        routes["ar"] += out.tokens_ar
        edits += out.edits
    n = len(prompts)
    acc = correct / n
    return {
        "acc": acc, "se": math.sqrt(acc * (1 - acc) / n), "nfe": nfe / n, "rows": rows / n,
        "tpf": gen_tokens / nfe, "wall": wall / n, "plan_tokens": routes["plan"] / n,
        "ar_tokens": routes["ar"] / n, "edits": edits / n,
    }


def table_rows(raw: dict) -> list[str]:
    """The Markdown table of ``raw`` ({fixture: {row label: figures}}); ratios against
    threshold on the same items (its ``threshold_same_items``, else the run's threshold row when
    that covers the same items), "—" without one."""
    out = ["| fixture | decoder | items | accuracy | ± s.e. | NFE | branch rows | TPF | plan tok "
           "| ar tok | edits | s/request | NFE vs threshold | wall vs threshold |", "|" + "---|" * 14]
    for name, results in raw.items():
        for label, r in results.items():
            base = r.get("threshold_same_items")
            whole = results.get("threshold")
            if base is None and whole is not None and _span(whole) == _span(r):
                base = whole
            if base is None:
                nfe_ratio = wall_ratio = "—"
            else:
                nfe_ratio, wall_ratio = f"{r['nfe'] / base['nfe']:.2f}x", f"{r['wall'] / base['wall']:.2f}x"
            first = r.get("first_item", 0)
            items = str(r["items"]) if first == 0 else f"{r['items']} (from item {first})"
            out.append(
                f"| {name} | {label} | {items} | {r['acc']:.3f} | {r['se']:.3f} | {r['nfe']:.2f} | {r['rows']:.2f} "
                f"| {r['tpf']:.2f} | {r['plan_tokens']:.1f} | {r['ar_tokens']:.1f} | {r['edits']:.1f} "
                f"| {r['wall'] * 1000:.1f} ms "
                f"| {nfe_ratio} | {wall_ratio} |")
    return out


def _span(r: dict) -> tuple[int, int]:
    """The items a result covers, [first, end)."""
    first = r.get("first_item", 0)
    return first, first + r["items"]


#: per-request means, merged weighted by items; TPF is a ratio of sums (tokens / NFE)
_MEANS = ("acc", "nfe", "rows", "wall", "plan_tokens", "ar_tokens", "edits")


def merge_figures(parts: list[dict]) -> dict:
    """One result from results over consecutive, non-overlapping item ranges (any order):
    means weighted by items, TPF as total tokens over total NFE, s.e. recomputed; the result
    covers the union. Raises ValueError naming the gap or overlap."""
    parts = sorted(parts, key=_span)
    for a, b in zip(parts, parts[1:]):
        if _span(a)[1] != _span(b)[0]:
            raise ValueError(f"items {_span(a)[0]}..{_span(a)[1] - 1} and {_span(b)[0]}.."
                             f"{_span(b)[1] - 1} are not consecutive")
    # files written before the edits statistic existed have none: no decoder edited then
    parts = [{"edits": 0.0, **p} for p in parts]
    n = sum(p["items"] for p in parts)
    out = {k: sum(p[k] * p["items"] for p in parts) / n for k in _MEANS}
    total_nfe = sum(p["nfe"] * p["items"] for p in parts)
    out["tpf"] = sum(p["tpf"] * p["nfe"] * p["items"] for p in parts) / total_nfe
    out["se"] = math.sqrt(out["acc"] * (1 - out["acc"]) / n)
    out["items"], out["first_item"] = n, _span(parts[0])[0]
    if all("threshold_same_items" in p for p in parts):
        out["threshold_same_items"] = merge_figures(
            [dict(p["threshold_same_items"], items=p["items"], first_item=_span(p)[0]) for p in parts])
    return out


def read_run(spec: str) -> dict:
    """The raw figures of a ``--json`` file, ``FILE`` or ``FILE:ROW,ROW`` (only those rows)."""
    path, _, rows = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    try:
        run = json.loads(Path(path).read_text())
    except OSError as e:
        raise SystemExit(f"--merge: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise SystemExit(f"--merge: {path} is not a --json file of this script: {e}") from None
    if not rows:
        return run
    keep = rows.split(",")
    missing = [r for r in keep if not any(r in results for results in run.values())]
    if missing:
        raise SystemExit(f"--merge: {path} has no row {missing[0]!r}")
    return {name: {k: v for k, v in results.items() if k in keep} for name, results in run.items()}


def merge_runs(runs: list[dict]) -> dict:
    """The raw figures of several ``--json`` files as one: each (fixture, row) merged over the
    files that have it (``merge_figures``); rows in the order first seen."""
    parts: dict[str, dict[str, list[dict]]] = {}
    for run in runs:
        for name, results in run.items():
            for label, r in results.items():
                parts.setdefault(name, {}).setdefault(label, []).append(r)
    merged = {}
    for name, rows in parts.items():
        merged[name] = {}
        for label, rs in rows.items():
            try:
                merged[name][label] = merge_figures(rs)
            except ValueError as e:
                raise SystemExit(f"--merge: {name} {label}: {e}") from None
    return merged


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_arguments(ap, task_option=True)
    ap.add_argument("--slow-limit", type=int, default=None,
                    help="static and freedave on the first N of the items only (stated in the table)")
    ap.add_argument("--only", nargs="+", default=None,
                    help="row labels to run (threshold always runs); also the opt-in rows: "
                         + ", ".join(repr(c[0]) for c in OPT_IN))
    ap.add_argument("--skip-threshold", action="store_true",
                    help="with --only: do not run threshold (the ratio columns then show —; for "
                         "splitting one table over several processes)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=16,
                    help="requests decoded together (outputs and NFE do not depend on it)")
    ap.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    ap.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), "
                    "float32, bfloat16")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    ap.add_argument("--start", type=int, default=0,
                    help="first held-out item (0-based); with --limit, the items start..limit-1")
    ap.add_argument("--merge", nargs="+", default=None, metavar="FILE[:ROW,...]",
                    help="decode nothing: merge these --json files (runs over consecutive items of "
                         "the same rows) into one table; FILE:ROW,ROW takes only those rows of it")
    args = ap.parse_args(argv)
    if args.merge:
        raw = merge_runs([read_run(spec) for spec in args.merge])
        print("\n".join(table_rows(raw)))
        if args.json:
            args.json.write_text(json.dumps(raw, indent=1) + "\n")
        return
    if args.skip_threshold and args.only is None:
        ap.error("--skip-threshold needs --only (the rows to run instead)")
    labels = [c[0] for c in CONFIGS + OPT_IN]
    unknown = [x for x in args.only or [] if x not in labels]
    if unknown:
        ap.error(f"--only: unknown row {unknown[0]!r}; rows: {', '.join(map(repr, labels))}")
    benchlib.task_gen_length(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    extract = benchlib.extract_answer(args.task)
    docs = benchlib.held_out(args.limit, task=args.task)
    if not 0 <= args.start < len(docs):
        ap.error(f"--start: {args.start} is not an item index; allowed: 0 to {len(docs) - 1}")
    docs = docs[args.start:]
    raw = {}
    print(f"{args.task} held-out items: {len(docs)} from item {args.start}; gen_length {args.gen_length}, block_length "
          f"{args.block_length}; batch size {args.batch_size}; torch threads {torch.get_num_threads()}", flush=True)
    for name in args.fixtures:
        model = load_model(name, device=args.device, dtype=args.dtype)
        print(f"{name}: {model.device}, {next(model.net.parameters()).dtype}", flush=True)
        prompts = benchlib.prompt_ids(model.tokenizer, docs)
        targets = [d["target"] for d in docs]
        results, subset_ref = {}, {}
        for label, decoder, extra in CONFIGS + [c for c in OPT_IN if args.only and c[0] in args.only]:
            if args.only is not None and label not in args.only and (
                    label != "threshold" or args.skip_threshold):
                continue
            refused = DECODERS[decoder].refuse(model)
            if refused:     # e.g. wino on a logit-shifted model: the row is left out, said here
                print(f"{name} {label}: not run: {refused}", file=sys.stderr, flush=True)
                continue
            n = args.slow_limit if label in SLOW and args.slow_limit else len(prompts)
            results[label] = run_config(model, prompts[:n], targets[:n], extract, decoder, extra,
                                        args.gen_length, args.block_length, args.batch_size)
            results[label]["items"] = n
            results[label]["first_item"] = args.start
            if n < len(prompts):     # threshold on the same items, for the ratios
                if n not in subset_ref:
                    subset_ref[n] = run_config(model, prompts[:n], targets[:n], extract, "threshold",
                                               {}, args.gen_length, args.block_length, args.batch_size)
                results[label]["threshold_same_items"] = subset_ref[n]
            print(f"{name} {label}: {results[label]}", file=sys.stderr, flush=True)
        raw[name] = results
    print("\n" + "\n".join(table_rows(raw)))
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
