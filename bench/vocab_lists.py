"""pvf on the first N held-out arith_var items with several planning vocabularies: routes=ar, the
calibrated and hand-written artifacts, eight punctuation/operator tokens, and the calibrated
artifact without its content tokens. Run from the repository root, one torch thread:

    python bench/vocab_lists.py dream 80
"""
import sys, json, re, torch
from pathlib import Path
REPO = Path.cwd()
sys.path.insert(0, str(REPO)); sys.path.insert(0, str(REPO / "bench"))
from pvf_lmeval.decoding import decode_batch, make_params
from pvf_lmeval.models import load_model
import arith_bench
torch.set_num_threads(1)
fam, n = sys.argv[1], int(sys.argv[2])
name = f"tiny-{fam}"
model = load_model(name, dtype="float32"); tok = model.tokenizer
docs = arith_bench.held_out(n, task="arith_var"); prompts = arith_bench.prompt_ids(tok, docs)
ex = arith_bench.extract_answer("arith_var")
art = lambda k: [t["id"] for t in json.load(open(REPO / f"vocab_artifacts/{name}.math-word.{k}.json"))["tokens"]]
cal = art("calibrated")
strs = {i: tok.convert_ids_to_tokens(i) for i in cal}
structural = [i for i in cal if re.fullmatch(r"[^\w]+|Ġ?(Step|So|We|When|With|Next|Then|Now|The|In|That|Let|At|First|us|again|keep|going|next|follow|order|change|the|to|more|from|he|she|so|has)", strs[i])]
punct = [tok.encode(w, add_special_tokens=False)[0] for w in [".", "\n", ",", ":", " =", " +", " -", "####"]]
print(name, "calibrated minus content:", [strs[i] for i in structural], flush=True)
configs = [("ar", "ar", []), ("calibrated", "plan+ar", cal), ("hand-written", "plan+ar", art("hand-written")),
           ("punct", "plan+ar", punct), ("cal-structural", "plan+ar", structural)]
for label, routes, ids in configs:
    p = make_params("pvf", preset="arith", gen_length=256, block_length=32, plan_vocab=ids or None, routes=routes)
    res = []
    for b0 in range(0, n, 25):
        res += decode_batch(model, prompts[b0:b0+25], params=p)
    acc = sum(ex(tok.decode(r.tokens[:r.gen_tokens])) == d["target"] for r, d in zip(res, docs)) / n
    print(f"{name} {label:15s} {routes:8s} {len(ids):3d} acc {acc:.3f} calls {sum(r.nfe for r in res)/n:.2f} "
          f"plan {sum(r.tokens_plan for r in res)/n:.1f} ar {sum(r.tokens_ar for r in res)/n:.1f}", flush=True)
