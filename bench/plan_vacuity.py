"""Why planning branches fail: pvf on the first N held-out arith_var items with an artifact's
list (`rules=RULES`, `routes=ROUTES`; default paper, plan+ar), printing accuracy, calls and, over
the planning branches tried, how many had an empty impact set (they fail by the paper's rule) and
how many of the others passed. Wraps the package's verify_plans; run from the repository root,
one torch thread:

    python bench/plan_vacuity.py dream 40 calibrated
    python bench/plan_vacuity.py dream 120 hand-written paper+impact_includes_committed plan+ar
"""
import sys, json, torch
from benchlib import pvf_step as P
from benchlib import decode_batch, make_params, load_model
import benchlib
from benchlib import REPO
torch.set_num_threads(1)
tally = {"tried": 0, "nonvac": 0, "passed": 0}
orig = P.verify_plans
def wrapped(base, plans, own, masked_base, tau, **kw):
    v = orig(base, plans, own, masked_base, tau, **kw)
    cand = own.any(-1)
    tally["tried"] += int(cand.sum()); tally["nonvac"] += int((v.nonvacuous & cand).sum())
    tally["passed"] += int((v.passed & cand).sum())
    return v
P.verify_plans = wrapped
fam, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rules, routes = (sys.argv[4:6] + ["paper", "plan+ar"][len(sys.argv[4:6]):])
name = f"tiny-{fam}"
model = load_model(name, dtype="float32"); tok = model.tokenizer
docs = benchlib.held_out(n, task="arith_var"); prompts = benchlib.prompt_ids(tok, docs)
ids = [t["id"] for t in json.load(open(REPO / f"vocab_artifacts/{name}.math-word.{kind}.json"))["tokens"]]
p = make_params("pvf", preset="arith", gen_length=256, block_length=32, plan_vocab=ids, rules=rules, routes=routes)
res = []
for b0 in range(0, n, 20):
    res += decode_batch(model, prompts[b0:b0+20], params=p)
ex = benchlib.extract_answer("arith_var"); acc = sum(ex(tok.decode(r.tokens[:r.gen_tokens])) == d["target"] for r, d in zip(res, docs)) / n
print(name, kind, rules, routes, n, f"acc {acc:.3f}", "calls", sum(r.nfe for r in res)/n, tally,
      f"vacuous share of tried {1 - tally['nonvac']/max(tally['tried'],1):.3f}, pass | nonvacuous {tally['passed']/max(tally['nonvac'],1):.3f}")
