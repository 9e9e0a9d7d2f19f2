"""Decode a fixed set of requests and write every outcome as JSON, to compare two commits.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/decode_records.py OUT.json
    python scripts/decode_records.py --compare BEFORE.json AFTER.json

What is decoded (CPU, float32, deterministic): every decoder (and the variants that take another
path: static with steps, freedave with the threshold rule, pvf under rules=reference and its
routes, explore picking by planning, sampling with top_k/top_p) under cache none, prefix and
dual (and dual_base for pvf), on tiny-llada and tiny-dream and on a tiny SDAR folder
(block diffusion, built as the tests build it), at batch 1 and 4, with ``decode_batch``; then the
lm-eval adapter (``generate_until`` with a task preset, a trace file, ``vocab=online``,
``loglikelihood``) at batch 1 and 4, with its ``config.pvf`` (timings dropped). A record holds the
tokens, NFE, branch rows, routes, counts and the step trace of each request; wall times are
dropped. ``--compare`` prints the number of identical records and the keys of those that differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = ["Question: 12 + 7 = ?\nAnswer:", "Question: Tom has 15 books and gets 7 more. "
           "How many books does he have?\nAnswer:", "Q: 3 * 4 =", "Question: 40 - 18 = ?"]
#: (label, decoder, parameters)
VARIANTS = [
    ("static", "static", {}),
    ("static-steps", "static", {"steps": 16}),
    ("threshold", "threshold", {}),
    ("threshold-factor", "threshold", {"factor": 1.0}),
    ("freedave", "freedave", {}),
    ("freedave-threshold", "freedave", {"base_rule": "threshold", "threshold": 0.7}),
    ("pvf", "pvf", {"preset": "arith"}),
    ("pvf-low", "pvf", {"threshold": 0.6, "plan_lo": 0.05, "plan_hi": 0.5, "ar_lo": 0.05}),
    ("pvf-reference", "pvf", {"preset": "arith", "rules": "reference", "threshold": 0.6,
                              "plan_lo": 0.05, "plan_hi": 0.5}),
    ("pvf-ar", "pvf", {"routes": "ar", "threshold": 0.6, "plan_hi": 0.5, "ar_lo": 0.01}),
    ("explore", "explore", {"preset": "arith", "pick": "planning", "band": "0.0:0.9"}),
    ("explore-random", "explore", {"pick": "random", "band": "0.0:0.9"}),
    ("threshold-sampled", "threshold", {"temperature": 0.8, "top_k": 20, "top_p": 0.9,
                                        "seed": 7}),
]
CACHES = ("none", "prefix", "dual")


def _result(r) -> dict:
    out = {k: getattr(r, k) for k in ("tokens", "nfe", "branch_rows", "routes", "committed",
                                      "gen_tokens", "gen_length", "early_stop", "tokens_base",
                                      "tokens_plan", "tokens_ar", "tokens_forced",
                                      "tokens_explore", "decoder", "plan_tried", "plan_passed",
                                      "block_size", "cache_exact")}
    out["steps"] = r.steps
    return out


def decode_records(model, name: str, gen_length: int, block_length: int | None) -> dict:
    from pvf_lmeval.decoding import PLANNING_DECODERS, decode_batch
    from pvf_lmeval.planning.vocab import resolve_vocab_for

    tok = model.tokenizer
    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    try:
        vocab, _ = resolve_vocab_for(model, "auto", task_family="math-word")
    except ValueError:      # no artifact for the family: the most frequent prompt tokens
        vocab = tuple(sorted({t for p in prompts for t in p}))[:40]
    out = {}
    variants = VARIANTS + [("pvf-dual_base", "pvf", {"preset": "arith", "threshold": 0.6,
                                                     "plan_lo": 0.05, "plan_hi": 0.5})]
    for label, decoder, kw in variants:
        caches = ("dual_base",) if label == "pvf-dual_base" else CACHES
        for cache in caches:
            for batch in (1, 4):
                kw2 = dict(kw, cache=cache, gen_length=gen_length)
                if block_length is not None:
                    kw2["block_length"] = block_length
                if decoder in PLANNING_DECODERS:
                    kw2["plan_vocab"] = vocab
                results = []
                for a in range(0, len(prompts), batch):
                    chunk = prompts[a:a + batch]
                    results += decode_batch(model, chunk, decoder, trace=True,
                                            request_indices=list(range(a, a + len(chunk))),
                                            **kw2)
                for i, r in enumerate(results):
                    out[f"decode/{name}/{label}/cache={cache}/batch={batch}/{i}"] = _result(r)
    return out


def adapter_records(batch: int, trace_dir: Path) -> dict:
    from lm_eval.api.instance import Instance

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    kwargs = {"until": ["Question:"], "do_sample": False, "max_gen_toks": 24}
    out = {}
    for label, args in (
            ("threshold", "pretrained=tiny-llada,decoder=threshold,block_length=8"),
            ("pvf", "pretrained=tiny-llada,decoder=pvf,block_length=8,seed=3"),
            ("pvf-dream-online", "pretrained=tiny-dream,decoder=pvf,block_length=8,vocab=online,"
                                 "online_explore=2,cache=prefix"),
            ("explore", "pretrained=tiny-dream,decoder=explore,gen_length=16,block_length=8,"
                        "pick=planning,seed=5")):
        trace = trace_dir / f"{label}-{batch}.jsonl"
        lm = PVFDiffusionLM.create_from_arg_string(f"{args},trace={trace}",
                                                   {"batch_size": batch, "device": "cpu"})
        reqs = [Instance(request_type="generate_until", doc={}, idx=0,
                         arguments=(p, dict(kwargs, **({"threshold": 0.7} if k == 2 else {}))),
                         metadata=("arith" if k % 2 else "gsm8k_pvf", k, 1))
                for k, p in enumerate(PROMPTS)]
        got = lm.generate_until(reqs)
        for k, g in enumerate(got):
            out[f"adapter/{label}/batch={batch}/{k}"] = {
                "text": str(g), "meta": {m: v for m, v in g.meta.items()
                                         if m not in ("wall_s", "tps")}}
        lik = [Instance(request_type="loglikelihood", doc={}, idx=0, arguments=(p, " 19"),
                        metadata=("arith", k, 1)) for k, p in enumerate(PROMPTS[:2])]
        if label == "threshold":
            out[f"adapter/{label}/batch={batch}/loglikelihood"] = [
                list(x) for x in PVFDiffusionLM.create_from_arg_string(
                    "pretrained=tiny-llada,decoder=threshold,block_length=8,mc_num=4,mc_batch=2,"
                    "seed=1", {"batch_size": batch, "device": "cpu"}).loglikelihood(lik)]
        info = lm.get_model_info()["pvf"]
        for task in info["totals"].values():
            task.pop("wall_s"), task.pop("tps")
        info.pop("compile", None)
        info["vocab"] = str(info.get("vocab")).replace(str(ROOT), "ROOT")
        out[f"adapter/{label}/batch={batch}/info"] = info
        out[f"adapter/{label}/batch={batch}/trace"] = [
            json.loads(line) for line in trace.read_text().splitlines()]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        same = sum(1 for k in a if k in b and a[k] == b[k])
        print(f"{same} of {len(a)} records identical ({len(b)} after)")
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                print("differs:", k)
        return 0 if same == len(a) == len(b) else 1
    import torch

    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(1234)         # lm-eval's --seed default: the run seed without a seed arg
    from pvf_lmeval.models import load_model
    from tests.helpers.qwen_folders import make_sdar_folder

    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tiny-llada", "tiny-dream"):
            records.update(decode_records(load_model(name, device="cpu"), name, 32, 8))
        sdar = make_sdar_folder(Path(tmp) / "sdar", seed=1)
        records.update(decode_records(load_model(str(sdar), device="cpu"), "sdar", 16, None))
        for batch in (1, 4):
            records.update(adapter_records(batch, Path(tmp)))
    args.out.write_text(json.dumps(records, sort_keys=True))
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
