"""Batch invariance on a device: the same requests decoded at several batch sizes, with and
without ``batch_invariant``, and what the option costs on a real model shape.

Part 1 (both tiny fixtures, every decoder, cache ``none`` and ``dual``): the first ``--items``
held-out ``arith_var`` prompts (gen_length 256, blocks of 32, greedy) are decoded in batches of
each ``--batch-sizes`` (consecutive items), once with the option off and once on. Per setting:
the requests whose tokens, NFE or branch_rows differ from batch size 1 (the first size given),
and whose any other field of the result differs (routes, every statistic but wall time). With
the option on every count must be 0; with it off the count is what a user's ``--batch_size``
changes. pvf and explore use ``preset=arith`` and the fixture's bundled vocabulary; static
commits 8 tokens per step (``steps = gen_length / 8``) to keep batch size 1 affordable.

Part 2 (``--shape llada-8b``, random weights of LLaDA-8B's shape): median milliseconds of one
model call (part 2 runs first), full (cache ``none``: 2 blocks of queries over a 512-token canvas) and cached
(``dual``: one block recomputed), at the rows of a pvf round (width 3: 4 rows per request) and
a threshold round (1 row per request) for 1 and 16 requests, option off vs on. At this size a
decode's time is its model calls, so the ratio of call times is the option's cost in tokens/s.

    python bench/gpu_invariance.py --out bench/results/DATE-h100/                 # one H100, ~3 min
    python bench/gpu_invariance.py --device cpu --dtype float32 --items 4 \\
        --batch-sizes 1,2 --gen-length 32 --decoders threshold,pvf --shape none    # CPU smoke

On the CPU in float32 the option runs the plain-torch implementation (``models/batch_invariant/
cpu.py``); where the option cannot run, the on rows report its one-line error.
``--compile``: part 1 with the fixtures compiled (``compile=true``; longer: one compile per
batch shape). Prints markdown; with ``--out`` also writes ``results.json`` and ``report.md`` there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from benchlib import (DECODERS, PLANNING_DECODERS, REPO, DecodeResult, decode_batch, load_model,
                      resolve_vocab_for)

TASK = REPO / "tasks" / "arith_var" / "data" / "test.jsonl"
#: result fields compared beside tokens, NFE and branch_rows (wall time is not a result)
OTHER = tuple(f.name for f in dataclasses.fields(DecodeResult)
              if f.name not in ("tokens", "nfe", "branch_rows", "wall_s", "steps"))


def prompts_of(model, n: int) -> list[list[int]]:
    docs = [json.loads(line) for line in TASK.read_text().splitlines()[:n]]
    return [model.tokenizer.encode(f"Question: {d['question']}\nAnswer:", add_special_tokens=False)
            for d in docs]


def decoder_kwargs(model, dec: str, cache: str, L: int) -> dict:
    kw = dict(gen_length=L, block_length=32 if L % 32 == 0 else L, cache=cache, temperature=0.0)
    if dec in PLANNING_DECODERS:
        ids, _ = resolve_vocab_for(model, "auto", task_family="math-word")
        kw.update(preset="arith", plan_vocab=list(ids or ()))
    if dec == "static":
        kw.update(steps=max(L // 8, L // kw["block_length"]))
    return kw


def decode_all(model, prompts, dec, kw, bs: int, on: bool, compile_step=None):
    out = []
    for a in range(0, len(prompts), bs):
        out += decode_batch(model, prompts[a:a + bs], dec, request_indices=list(range(a, a + len(
            prompts[a:a + bs]))), batch_invariant=on, compile_step=compile_step, **kw)
    return out


def invariance(args, rows: list, save) -> list[dict]:
    """Part 1; appends to ``rows`` and calls ``save()`` after each setting (a run cut short
    keeps what it measured)."""
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    for fx in args.fixtures.split(","):
        model = load_model(fx, device=args.device, dtype=args.dtype)
        if args.compile:
            model.compile()
        prompts = prompts_of(model, args.items)
        for dec in args.decoders.split(","):
            for cache in args.caches.split(","):
                kw = decoder_kwargs(model, dec, cache, args.gen_length)
                for on in (False, True):
                    row = dict(fixture=fx, decoder=dec, cache=cache, batch_invariant=on,
                               items=len(prompts))
                    try:
                        t0 = time.perf_counter()
                        res = {bs: decode_all(model, prompts, dec, kw, bs, on,
                                              {} if args.compile else None) for bs in sizes}
                        row["seconds"] = round(time.perf_counter() - t0, 2)
                    except ValueError as e:
                        row["error"] = str(e)
                        rows.append(row)
                        save()
                        print(f"{fx} {dec} {cache} on={on}: {e}", flush=True)
                        continue
                    ref = res[sizes[0]]
                    for bs in sizes[1:]:
                        got = res[bs]
                        row[f"b{bs}"] = {
                            "tokens": sum(a.tokens != b.tokens for a, b in zip(ref, got)),
                            "nfe": sum(a.nfe != b.nfe for a, b in zip(ref, got)),
                            "branch_rows": sum(a.branch_rows != b.branch_rows
                                               for a, b in zip(ref, got)),
                            "any": sum(any(getattr(a, f) != getattr(b, f) for f in OTHER)
                                       or a.tokens != b.tokens or a.nfe != b.nfe
                                       or a.branch_rows != b.branch_rows
                                       for a, b in zip(ref, got))}
                    rows.append(row)
                    save()
                    print(json.dumps(row), flush=True)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def call_ms(model, rows: int, cache: str, on: bool, reps: int, device) -> float:
    """Median ms of one model call of ``rows`` rows (a 256-token prompt, gen_length 256,
    blocks of 32): full over 2 blocks of queries, or cached recomputing one block."""
    from throughput import time_call
    with model.batch_invariant() if on else _null():
        return time_call(model, 256, 256, 32, rows, cache, reps, device) * 1e3


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def speed(args, out: list, save) -> list[dict]:
    """Part 2; appends to ``out`` and saves after each setting."""
    from benchlib import random_model
    model = random_model(args.shape, torch.device(args.device), getattr(torch, args.dtype))
    for dec, per in (("pvf", 4), ("threshold", 1)):
        for n in (1, 16):
            for cache in ("none", "dual"):
                off = call_ms(model, n * per, cache, False, args.reps, args.device)
                try:
                    on = call_ms(model, n * per, cache, True, args.reps, args.device)
                except ValueError as e:
                    on = None
                    print(f"speed on: {e}", flush=True)
                row = dict(shape=args.shape, decoder=dec, requests=n, rows=n * per, cache=cache,
                           off_ms=round(off, 3), on_ms=None if on is None else round(on, 3),
                           cost=None if on is None else round(on / off - 1, 4))
                out.append(row)
                save()
                print(json.dumps(row), flush=True)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def report(inv: list[dict], spd: list[dict], args, device_name: str) -> str:
    sizes = [int(s) for s in args.batch_sizes.split(",")][1:]
    head = "| fixture | decoder | cache | batch_invariant | " + " | ".join(
        f"b{s}: tokens / nfe / branch_rows / any" for s in sizes) + " |"
    lines = [f"# Batch invariance ({device_name}, {args.dtype}, {args.items} arith_var items, "
             f"gen_length {args.gen_length}; requests differing from batch {args.batch_sizes.split(',')[0]})",
             "", head, "|" + "---|" * (4 + len(sizes))]
    for r in inv:
        cells = [r.get("error", "")] if "error" in r else [
            "{tokens} / {nfe} / {branch_rows} / {any}".format(**r[f"b{s}"]) for s in sizes]
        lines.append(f"| {r['fixture']} | {r['decoder']} | {r['cache']} | "
                     f"{'on' if r['batch_invariant'] else 'off'} | " + " | ".join(cells) + " |")
    if spd:
        lines += ["", f"## Cost on the {args.shape} shape (random weights; ms per model call, "
                  f"median of {args.reps})", "",
                  "| decoder | requests | rows | cache | off ms | on ms | cost |",
                  "|---|---|---|---|---|---|---|"]
        for r in spd:
            cost = "n/a" if r["cost"] is None else f"{100 * r['cost']:+.1f}%"
            lines.append(f"| {r['decoder']} | {r['requests']} | {r['rows']} | {r['cache']} | "
                         f"{r['off_ms']} | {r['on_ms']} | {cost} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--fixtures", default="tiny-llada,tiny-dream")
    ap.add_argument("--decoders", default=",".join(DECODERS))
    ap.add_argument("--caches", default="none,dual")
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--shape", default="llada-8b", help="real shape for the cost, or none")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the fixtures (blocks) for part 1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    for d in args.decoders.split(","):
        if d not in DECODERS:
            raise SystemExit(f"--decoders: {d!r} is not one of {', '.join(DECODERS)}")
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    t0 = time.perf_counter()
    inv: list[dict] = []
    spd: list[dict] = []

    def save() -> None:
        if args.out is None:
            return
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"device": name, "torch": torch.__version__, "args": {k: str(v) for k, v in
                                                                  vars(args).items()},
             "seconds": round(time.perf_counter() - t0, 1), "invariance": inv, "speed": spd},
            indent=1))
        (args.out / "report.md").write_text(report(inv, spd, args, name))

    # the cost first (it decides the default), then the counts
    if args.shape != "none":
        speed(args, spd, save)
    invariance(args, inv, save)
    save()
    print(report(inv, spd, args, name))
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
