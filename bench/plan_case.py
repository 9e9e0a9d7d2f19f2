"""A planning commit that unlocks a sentence: the paper's case study, on a tiny fixture.

Decodes held-out items with pvf (``trace=True``), and for every planning commit counts the
positions committed in the *next* step on the same line of the solution (a line is a sentence
of the solution), that were still masked when the planning commit was made. Picks the commit
that unlocked the most and writes a Markdown page: the item, the line's canvas before the
planning step, after it, and after the next step, with the route of every committed token.

    python bench/plan_case.py --model tiny-llada --limit 32 --out docs/arith_var_trace.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from pvf_lmeval.decoding import decode_batch, make_params
from pvf_lmeval.models import load_model
from pvf_lmeval.planning.vocab import resolve_vocab_for

import benchlib

MASK = "▯"


def step_of(result) -> list[int | None]:
    """0-based step at which each generated position was committed (None: early-stop fill)."""
    out: list[int | None] = [None] * len(result.tokens)
    for rec in result.steps:
        for pos, _route in rec["committed"]:
            out[pos] = rec["step"]
    return out


def lines_of(pieces: list[str]) -> list[int]:
    """Line number of each position (a piece holding a newline ends its line)."""
    out, line = [], 0
    for p in pieces:
        out.append(line)
        line += p.count("\n")
    return out


def best_case(result, pieces, cut):
    """(unlocked count, plan step, plan position) of the planning commit before the answer's end
    (``cut``) whose next step commits the most positions on its line (None if there is none)."""
    steps = step_of(result)
    line = lines_of(pieces)
    best = None
    for rec in result.steps:
        for pos, route in rec["committed"]:
            if route != "plan" or pos >= cut:
                continue
            s = rec["step"]
            unlocked = sum(1 for q, st in enumerate(steps[:cut]) if st == s + 1 and line[q] == line[pos])
            if best is None or unlocked > best[0]:
                best = (unlocked, s, pos)
    return best


def render(pieces, steps, routes, upto, positions) -> str:
    out = []
    for q in positions:
        if steps[q] is not None and steps[q] <= upto:
            text = pieces[q].replace("\n", "⏎")
            out.append({"plan": f"⟦{text}⟧", "ar": f"‹{text}›"}.get(routes[q], text))
        else:
            out.append(MASK)
    return "".join(out).replace("`", "'")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llada")
    ap.add_argument("--task", default="arith_var", choices=list(benchlib.TASKS))
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="Markdown page (default: print)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype="float32")
    tok = model.tokenizer
    gen_length = benchlib.TASKS[args.task][1]
    params = make_params("pvf", preset="arith", gen_length=gen_length, block_length=32)
    ids, how = resolve_vocab_for(model, task_family=params.family)
    params = make_params("pvf", preset="arith", gen_length=gen_length, block_length=32, plan_vocab=ids)
    docs = benchlib.held_out(args.limit, task=args.task)
    prompts = benchlib.prompt_ids(tok, docs)
    results = []
    for b0 in range(0, len(prompts), args.batch_size):
        chunk = prompts[b0:b0 + args.batch_size]
        results += decode_batch(model, chunk, params=params, trace=True,
                                request_indices=list(range(b0, b0 + len(chunk))))
    cases = []
    for k, r in enumerate(results):
        pieces = [tok.decode([t]) for t in r.tokens]
        cut = next((i for i, t in enumerate(r.tokens) if t in model.eos_ids), len(r.tokens))
        case = best_case(r, pieces, cut)
        if case is not None:
            cases.append((case, k, pieces))
    n_plan = sum(r.tokens_plan for r in results)
    summary = (f"{len(results)} held-out `{args.task}` items, pvf (`preset=arith`, vocabulary "
               f"{Path(how.split(':', 1)[-1]).name}), {args.model}: {n_plan} planning commits in all, "
               f"{sum(r.nfe for r in results) / len(results):.1f} calls per request.")
    if not cases:
        print(summary + " No planning commit.")
        return
    (unlocked, s, pos), k, pieces = max(cases, key=lambda c: c[0][0])
    r, d = results[k], docs[k]
    steps, line = step_of(r), lines_of(pieces)
    cut = next((i for i, t in enumerate(r.tokens) if t in model.eos_ids), len(r.tokens))
    positions = [q for q in range(cut) if line[q] == line[pos]]
    rec = r.steps[s]
    page = [
        f"# A planning commit unlocks a sentence ({args.model}, `{args.task}`)", "",
        "Generated by `python bench/plan_case.py "
        f"--model {args.model} --task {args.task} --limit {args.limit}` (greedy, gen_length "
        f"{gen_length}, blocks of 32, `cache=none`). {summary}", "",
        f"Item {k} of the held-out set. Question:", "", f"> {d['question']}", "",
        "The model's full answer:", "", "```", tok.decode(r.tokens[:cut]), "```", "",
        f"At step {s} (call {rec['nfe']} of {r.nfe}) the planning route committed "
        f"`{pieces[pos]!s}` at position {pos} (below: `⟦x⟧` = committed by the planning route, "
        f"`‹x›` = by the AR route, {MASK} = still masked). In the next step the base rule committed "
        f"{unlocked} more positions of that line at once:", "",
        "| after step | the line |", "|---|---|",
        f"| {s - 1} (before planning) | `{render(pieces, steps, r.routes, s - 1, positions)}` |",
        f"| {s} (planning commit) | `{render(pieces, steps, r.routes, s, positions)}` |",
        f"| {s + 1} (next step) | `{render(pieces, steps, r.routes, s + 1, positions)}` |",
        f"| end | `{render(pieces, steps, r.routes, 10 ** 9, positions)}` |", "",
        "Step record of the planning step (candidates tried, verification outcome):", "",
        "```", str({k2: v for k2, v in rec.items() if k2 != "committed"}), "```", "",
    ]
    text = "\n".join(page)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}: item {k}, step {s}, {unlocked} positions unlocked")
    else:
        print(text)


if __name__ == "__main__":
    main()
