"""pvf on arith_var under the paper's impact rule and under the published code's
(`rules=paper+impact_includes_committed`, switch 4 of `rules=reference`): on the first N held-out
arith_var items, threshold, `pvf routes=ar`, and pvf (plan+ar, `preset=arith`) with the calibrated
and the hand-written list under each rule. Prints one JSON line per row: accuracy, its standard
error, calls per request, planning / AR tokens and planning branches tried / passed per request, and the call ratios
(pvf vs threshold, plan+ar vs routes=ar). Run from the repository root, one torch thread, batches
of 32 (outputs and calls do not depend on the batch):

    python bench/impact_rule.py llada 200
"""
import json
import math
import sys

import torch

from benchlib import decode_batch, make_params, load_model
import benchlib
from benchlib import REPO

torch.set_num_threads(1)
fam, n = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
name = f"tiny-{fam}"
model = load_model(name, dtype="float32"); tok = model.tokenizer
docs = benchlib.held_out(n, task="arith_var"); prompts = benchlib.prompt_ids(tok, docs)
extract = benchlib.extract_answer("arith_var")


def vocab(kind):
    art = json.load(open(REPO / f"vocab_artifacts/{name}.math-word.{kind}.json"))
    return [t["id"] for t in art["tokens"]]


def run(label, params):
    res = []
    for b0 in range(0, n, batch):
        res += decode_batch(model, prompts[b0:b0 + batch], params=params)
    acc = sum(extract(tok.decode(r.tokens[:r.gen_tokens])) == d["target"] for r, d in zip(res, docs)) / n
    row = {"fixture": name, "row": label, "items": n, "acc": round(acc, 4),
           "se": round(math.sqrt(acc * (1 - acc) / n), 4), "calls": sum(r.nfe for r in res) / n}
    for key in ("tokens_plan", "tokens_ar", "plan_tried", "plan_passed"):
        row[key] = round(sum(getattr(r, key) for r in res) / n, 2)
    return row


common = dict(gen_length=256, block_length=32)
rows = {"threshold": run("threshold", make_params("threshold", **common))}
rows["routes=ar"] = run("pvf routes=ar", make_params("pvf", preset="arith", routes="ar", **common))
for rules in ("paper", "paper+impact_includes_committed"):
    for kind in ("calibrated", "hand-written"):
        label = f"pvf {kind} rules={rules}"
        rows[label] = run(label, make_params("pvf", preset="arith", plan_vocab=vocab(kind), rules=rules, **common))
thr, ar = rows["threshold"]["calls"], rows["routes=ar"]["calls"]
for label, row in rows.items():
    row["vs_threshold"] = round(row["calls"] / thr, 3)
    row["vs_routes_ar"] = round(row["calls"] / ar, 3)
    print(json.dumps(row), flush=True)
