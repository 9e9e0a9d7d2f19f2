"""Decoding throughput per decoder x cache mode, and the cost of one call vs branch width.

Tiny fixtures (default; CPU, where calls are dispatch-bound): on held-out `arith` prompts, for
each decoder (`static`, `threshold`, `freedave`, `pvf` with the `arith` preset) and cache mode
(`none`, `prefix`, `dual`): tokens per second (answer tokens / wall, ratio of sums), mean NFE,
mean branch rows, tokens per forward, accuracy, peak memory, and tokens/s ratios against
`threshold`+`none` and `static`+`none` measured in the same run. The schedule of every run
(calls per block, branch widths, full vs cached calls) is recorded.

Real shapes (`--shape llada-8b` / `--shape dream-7b`; bf16, CUDA): a randomly initialised model of
the real shape. Random weights decide nothing, so each decoder x cache mode *replays* a decoding
schedule: by default the one recorded from the tiny-fixture runs (`--schedule tiny`: calls per
block and branch widths, cycled over the blocks of `--shape-gen-length`; written to / read from
`--schedule-file`), or the paper's averages (`--schedule paper`: the calls per 512 tokens of the paper's
Table 1 for LLaDA-8B-Instruct on GSM8K, static 512, threshold 89.77, freedave 135.65, pvf 31.34,
spread evenly over the blocks, with the tiny runs' branch widths). Every replayed request is taken to produce
`--shape-gen-length` tokens. The script says which schedule it used.

Both parts also print the cost of one model call at branch widths 1, 2, 4, 8 against width 1,
without a cache and with the dual cache (a cached call recomputing one block), prompt length
stated: the paper's "free lunch" claim, measured.

    python bench/throughput.py                                 # tiny fixtures, CPU
    python bench/throughput.py --limit 16 --fixtures tiny-llada --json out.json
    python bench/throughput.py --shape llada-8b --schedule-file sched.json   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchlib import (PLANNING_DECODERS, decode_batch, make_params, load_model, cache_segments,
                      is_cached_call, FIXTURES_DIR)

import benchlib
from benchlib import (PAPER_CALLS_PER_512, SHAPES, CacheDriftProbe, KVCache, call_view, peak_mib,
                      random_model, reset_peak, sync)

DECODERS = ("static", "threshold", "freedave", "pvf")
CACHES = ("none", "prefix", "dual")
WIDTHS = (1, 2, 4, 8)


class ScheduleRecorder:
    """Wraps a model; records each call as (request, rows, cached, block). Set ``req`` and
    ``P0`` before decoding a request (batch size 1)."""

    def __init__(self, model, block_length: int):
        self.model, self.B = model, block_length
        self.req, self.P0 = 0, 0
        self.calls: list[tuple[int, int, bool, int]] = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        cached = is_cached_call(cache_segments(cache, tokens.shape[0]))
        first = int(positions.reshape(-1)[0])
        self.calls.append((self.req, int(tokens.shape[0]), cached, (first - self.P0) // self.B))
        return self.model.logits(tokens, positions, attention_mask=attention_mask, cache=cache)


# ---------------------------------------------------------------- tiny fixtures


def run_tiny(name, args, extract, docs):
    model = maybe_compile(load_model(name, device=args.device), args)
    prompts = benchlib.prompt_ids(model.tokenizer, docs)
    out, schedules = {}, {}
    vocab = None
    for dec in args.decoders:
        for cache in args.caches:
            extra = {"preset": "arith"} if dec in PLANNING_DECODERS else {}
            params = make_params(dec, gen_length=args.gen_length, block_length=args.block_length,
                                 cache=cache, **extra)
            if dec in PLANNING_DECODERS:
                if vocab is None:
                    from benchlib import resolve_vocab_for
                    vocab, _ = resolve_vocab_for(model, task_family=params.family)
                params = make_params(dec, gen_length=args.gen_length,
                                     block_length=args.block_length, cache=cache,
                                     plan_vocab=vocab, **extra)
            # One untimed request first: first-call costs (allocator, kernel selection, lazy
            # initialisation) must not land on whichever configuration happens to run first.
            warm = prompts if args.compile != "off" else prompts[:1]   # compiled: every shape
            for a in range(0, len(warm), args.batch_size):
                decode_batch(model, warm[a:a + args.batch_size], params=params,
                             request_indices=list(range(a, a + args.batch_size)),
                             compile_step=step_options(args))
            rec = ScheduleRecorder(model, args.block_length)
            reset_peak(args.device)
            results = []
            sync(args.device)
            t0 = time.perf_counter()
            for a in range(0, len(prompts), args.batch_size):
                rec.req, rec.P0 = a, max(len(p) for p in prompts[a:a + args.batch_size])
                results += decode_batch(rec, prompts[a:a + args.batch_size], params=params,
                                        request_indices=list(range(a, a + args.batch_size)),
                                        compile_step=step_options(args))
            sync(args.device)
            wall = time.perf_counter() - t0
            n = len(results)
            gen = sum(r.gen_tokens for r in results)
            nfe = sum(r.nfe for r in results)
            texts = [model.tokenizer.decode(r.tokens[:r.gen_tokens], skip_special_tokens=True)
                     for r in results]
            acc = sum(extract(t) == d["target"] for t, d in zip(texts, docs)) / n
            out[(dec, cache)] = {
                "tps": gen / wall, "nfe": nfe / n, "rows": sum(r.branch_rows for r in results) / n,
                "tpf": gen / nfe, "acc": acc, "se": math.sqrt(acc * (1 - acc) / n),
                "peak_mib": peak_mib(args.device), "wall_s": wall, "gen_tokens": gen / n}
            schedules[f"{dec}/{cache}"] = schedule_of(rec.calls, args.block_length, len(prompts[0]))
            if args.drift and cache != "none":      # a separate, untimed pass
                probe = CacheDriftProbe(model)
                for a in range(min(args.drift, len(prompts))):
                    decode_batch(probe, prompts[a:a + 1], params=params, request_indices=[a],
                                 compile_step=step_options(args))
                out[(dec, cache)]["drift"] = probe.summary()
            print(f"{name} {dec:9s} {cache:6s} {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out[(dec, cache)].items()})}",
                  file=sys.stderr, flush=True)
    return model, prompts, out, schedules


def schedule_of(calls, B: int, _p0: int) -> dict:
    """Calls per (request, block) and branch widths of a recorded run, in call order (exact with
    batch size 1; with larger batches a pooled call counts once per batch)."""
    per_block: dict[tuple[int, int], int] = defaultdict(int)
    for req, _, _, blk in calls:
        per_block[(req, blk)] += 1
    return {"calls_per_block": list(per_block.values()), "widths": [c[1] for c in calls],
            "cached_share": sum(c[2] for c in calls) / max(1, len(calls))}


def table(rows: dict, title: str, device_note: str) -> str:
    lines = [f"\n### {title}\n", device_note + "\n",
             "| decoder | cache | tokens/s | NFE | branch rows | TPF | acc ± s.e. | peak MiB "
             "| vs threshold+none | vs static+none |", "|" + "---|" * 10]
    base_t = rows.get(("threshold", "none"), {}).get("tps")
    base_s = rows.get(("static", "none"), {}).get("tps")
    for (dec, cache), r in rows.items():
        acc = f"{r['acc']:.3f} ± {r['se']:.3f}" if "acc" in r else "—"
        vt = f"{r['tps'] / base_t:.2f}x" if base_t else "—"
        vs = f"{r['tps'] / base_s:.2f}x" if base_s else "—"
        lines.append(
            f"| {dec} | {cache} | {r['tps']:.1f} | {r['nfe']:.2f} | {r['rows']:.2f} | {r['tpf']:.2f} "
            f"| {acc} | {r['peak_mib']:.0f} | {vt} | {vs} |")
    return "\n".join(lines)


def drift_table(rows: dict, n: int) -> str:
    lines = [f"\n### Cache drift (cached vs uncached logits of the same rows, every cached call, "
             f"first {n} prompts)\n",
             "| decoder | cache | cached calls | full calls | max abs | mean abs | argmax agree |",
             "|---|---|---|---|---|---|---|"]
    for (dec, cache), r in rows.items():
        d = r.get("drift")
        if d:
            lines.append(f"| {dec} | {cache} | {d['cached_calls']} | {d['full_calls']} "
                         f"| {d['max_abs']:.3f} | {d['mean_abs']:.4f} | {d['argmax_agree']:.4f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- one call vs width


def time_call(model, prompt_len: int, L: int, B: int, width: int, cache: str, reps: int,
              device) -> float:
    """Median seconds of one model call on ``width`` rows (block 0 active; block 0 half filled).
    ``cache=dual``: a cached call recomputing block 0 (the cache built once, not timed)."""
    g = torch.Generator().manual_seed(0)
    V = min(model.decodable, model.vocab_size) - 2
    y = torch.cat([torch.randint(4, V, (prompt_len,), generator=g),
                   torch.full((L,), model.mask_id)]).to(device)
    y[prompt_len:prompt_len + B // 2] = torch.randint(4, V, (B // 2,), generator=g).to(device)
    rows = y.unsqueeze(0).repeat(width, 1)
    for i in range(1, width):
        rows[i, prompt_len + B // 2 + (i - 1) % (B // 2)] = 5
    c = None
    if cache == "dual":
        c = KVCache("dual", prompt_len=prompt_len, gen_length=L, block_length=B,
                    mask_id=model.mask_id, reveal_next=0, device=device)
        c.start_full(y[prompt_len:].unsqueeze(0))
        model.logits(y.unsqueeze(0), torch.arange(prompt_len, prompt_len + 2 * B, device=device),
                     cache=call_view(c, 1))
        c.commit(y[prompt_len:])
        c.span = (prompt_len, prompt_len + B)
        positions = torch.arange(prompt_len, prompt_len + B, device=device)
    else:
        positions = torch.arange(prompt_len, prompt_len + 2 * B, device=device)
    times = []
    for _ in range(reps + 1):
        sync(device)
        t0 = time.perf_counter()
        model.logits(rows, positions, cache=call_view(c, rows.shape[0]))
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def width_table(model, prompt_len: int, L: int, B: int, reps: int, device, label: str) -> str:
    t = {(w, c): time_call(model, prompt_len, L, B, w, c, reps, device)
         for c in ("none", "dual") for w in WIDTHS}
    lines = [f"\n### One call vs branch width: {label}\n",
             f"prompt length {prompt_len}, gen_length {L}, block {B} (canvas {prompt_len + L} "
             f"tokens); dual = a cached call recomputing one block; median of {reps}\n",
             "| width | none ms | none vs width 1 | dual ms | dual vs width 1 | dual vs none |",
             "|---|---|---|---|---|---|"]
    for w in WIDTHS:
        lines.append(f"| {w} | {t[w, 'none'] * 1e3:.2f} | {t[w, 'none'] / t[1, 'none']:.2f}x "
                     f"| {t[w, 'dual'] * 1e3:.2f} | {t[w, 'dual'] / t[1, 'dual']:.2f}x "
                     f"| {t[w, 'dual'] / t[w, 'none']:.2f}x |")
    return "\n".join(lines)


# ---------------------------------------------------------------- real shapes (replay)


def replay_schedule(sched: dict, dec: str, mode: str, L: int, B: int) -> list[list[int]]:
    """Per block, the branch widths of its calls. ``tiny``: the recorded calls-per-block and
    widths, cycled over the blocks; ``paper``: the paper's calls per 512 tokens for ``dec``
    (PAPER_CALLS_PER_512, scaled to L and spread evenly over the blocks) with the recorded
    widths."""
    nb = L // B
    cpb, widths = sched["calls_per_block"], sched["widths"]
    out, w = [], 0
    for b in range(nb):
        if mode == "paper" and dec in PAPER_CALLS_PER_512:
            total = round(PAPER_CALLS_PER_512[dec] * L / 512)
            k = total // nb + (1 if b < total % nb else 0)
        else:
            k = cpb[b % len(cpb)]
        out.append([widths[(w + i) % len(widths)] for i in range(max(1, k))])
        w += k
    return out


def replay(model, blocks: list[list[int]], cache: str, prompt_len: int, L: int, B: int, device,
           reveal: bool = False) -> float:
    """Seconds to run one request's replayed calls (random canvases, the real call shapes)."""
    g = torch.Generator().manual_seed(1)
    V = model.vocab_size - 3
    y = torch.cat([torch.randint(4, V, (prompt_len,), generator=g),
                   torch.full((L,), model.mask_id)]).to(device)
    c = None
    if cache != "none":
        c = KVCache(cache, prompt_len=prompt_len, gen_length=L, block_length=B,
                    mask_id=model.mask_id, reveal_next=0, device=device)
    sync(device)
    t0 = time.perf_counter()
    for b, widths in enumerate(blocks):
        s0 = prompt_len + b * B
        for i, w in enumerate(widths):
            rows = y.unsqueeze(0).expand(w, -1)
            full = c is None or i == 0
            hi = min(prompt_len + L, s0 + 2 * B)
            if c is not None:
                if full:
                    c.start_full(y[prompt_len:].unsqueeze(0).expand(w, -1))
                else:
                    c.span = (s0, prompt_len + L if cache == "prefix" else s0 + B)
                    hi = s0 + 2 * B if cache == "prefix" else s0 + B
                    hi = min(hi, prompt_len + L)
            model.logits(rows, torch.arange(s0, hi, device=device), cache=call_view(c, rows.shape[0]))
            if c is not None and full:
                c.commit(y[prompt_len:])
            # commit a share of the block so that later canvases differ
            k = max(1, B // len(widths))
            y[s0 + i * k: s0 + min(B, (i + 1) * k)] = 7
    sync(device)
    return time.perf_counter() - t0


def maybe_compile(model, args):
    if args.compile != "off":
        model.compile(scope=args.compile, mode=args.compile_mode)
    return model


def step_options(args) -> dict | None:
    """The statistics pass compiled with the model (decode_batch's ``compile_step``), as the
    adapter's ``compile`` does."""
    return None if args.compile == "off" else {"mode": args.compile_mode}


def compile_label(args) -> str:
    if args.compile == "off":
        return "eager"
    return f"torch.compile scope={args.compile} mode={args.compile_mode}"


def run_shape(args, schedules: dict, schedule_label: str) -> str:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = maybe_compile(random_model(args.shape, device, dtype), args)
    L, B, P = args.shape_gen_length, args.shape_block_length, args.prompt_len
    rows = {}
    for dec in args.decoders:
        for cache in args.caches:
            key = f"{dec}/{cache}"
            sched = schedules.get(key) or schedules.get(f"{dec}/none")
            if sched is None:
                print(f"no schedule for {key}; skipped", file=sys.stderr)
                continue
            blocks = replay_schedule(sched, dec, args.schedule, L, B)
            t0 = time.perf_counter()     # warm-up (the whole schedule when compiling)
            replay(model, blocks if args.compile != "off" else blocks[:1], cache, P, L, B, device)
            print(f"{args.shape} {key}: warm-up {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            reset_peak(device)
            secs = [replay(model, blocks, cache, P, L, B, device) for _ in range(args.shape_reps)]
            wall = statistics.median(secs)
            nfe = sum(len(b) for b in blocks)
            rows[(dec, cache)] = {"tps": L / wall, "nfe": nfe,
                                  "rows": sum(sum(b) for b in blocks), "tpf": L / nfe,
                                  "peak_mib": peak_mib(device), "wall_s": wall}
            print(f"{args.shape} {key}: {rows[(dec, cache)]}", file=sys.stderr, flush=True)
    note = (f"random {args.shape} ({dtype}, {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}); "
            f"prompt {P}, gen_length {L}, block {B}; schedule: {schedule_label}; every request "
            f"taken to produce {L} tokens; median of {args.shape_reps}; {compile_label(args)}")
    out = table(rows, f"Replayed schedules on the {args.shape} shape", note)
    if args.width_reps > 0:
        out += "\n" + width_table(model, P, L, B, args.width_reps, device, f"random {args.shape}")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_arguments(ap, fixtures_default=None, limit_default=32,
                              fixtures_help="default: tiny-llada and tiny-dream (those with weights)",
                              limit_help="held-out arith items")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--decoders", nargs="+", default=list(DECODERS),
                    choices=DECODERS + ("explore",))
    ap.add_argument("--caches", nargs="+", default=list(CACHES), choices=CACHES)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="default: cuda with --shape, else cpu")
    ap.add_argument("--width-reps", type=int, default=20,
                    help="timed calls per width in the one-call table (0: no table)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None)
    ap.add_argument("--schedule", choices=("tiny", "paper"), default="tiny")
    ap.add_argument("--schedule-file", type=Path, default=None,
                    help="schedules recorded by a tiny run (written by a tiny run, read with --shape)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--shape-gen-length", type=int, default=512)
    ap.add_argument("--shape-block-length", type=int, default=64)
    ap.add_argument("--shape-reps", type=int, default=3)
    ap.add_argument("--drift", type=int, default=0, metavar="N",
                    help="also measure the cache's logit drift on the first N prompts (untimed)")
    ap.add_argument("--compile", choices=("off", "model", "blocks"), default="off",
                    help="torch.compile the model call (DiffusionLM.compile scope); every "
                         "configuration then warms up on its whole schedule first (untimed)")
    ap.add_argument("--compile-mode", default="default",
                    choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.device is None:
        args.device = "cuda" if args.shape and args.shape != "tiny-random" else "cpu"
    if args.shape and args.shape != "tiny-random" and not torch.cuda.is_available():
        sys.exit(f"--shape {args.shape} needs a CUDA GPU (bf16); none is visible here")
    raw: dict = {}
    schedules: dict = {}
    if args.shape and args.schedule_file and args.schedule_file.exists():
        schedules = json.loads(args.schedule_file.read_text())
        label = f"{args.schedule} (recorded tiny-fixture schedules from {args.schedule_file})"
    else:
        fixtures = args.fixtures or [f for f in benchlib.FIXTURES
                                     if (FIXTURES_DIR / f / "model.safetensors").exists()]
        docs = benchlib.held_out(args.limit)
        extract = benchlib.extract_answer()
        tiny_device = "cpu" if args.shape else args.device
        saved, args.device = args.device, tiny_device
        print(f"arith held-out items: {len(docs)}; gen_length {args.gen_length}, block "
              f"{args.block_length}; batch size {args.batch_size}; torch threads "
              f"{torch.get_num_threads()}; device {tiny_device}", flush=True)
        for name in fixtures:
            model, prompts, rows, sched = run_tiny(name, args, extract, docs)
            raw[name] = {f"{d}/{c}": r for (d, c), r in rows.items()}
            schedules = schedules or sched
            raw[f"{name}/schedules"] = sched
            note = (f"{len(docs)} held-out arith items, gen_length {args.gen_length}, block "
                    f"{args.block_length}, batch size {args.batch_size}, {tiny_device}, "
                    f"{torch.get_num_threads()} thread(s), {compile_label(args)}; peak = process max "
                    f"RSS on a CPU")
            print(table(rows, f"{name}: decoder x cache", note), flush=True)
            if args.drift:
                print(drift_table(rows, args.drift), flush=True)
            P = round(statistics.mean(len(p) for p in prompts))
            if args.width_reps > 0:
                print(width_table(model, P, args.gen_length, args.block_length, args.width_reps,
                                  tiny_device, name), flush=True)
        args.device = saved
        label = f"{args.schedule} (recorded from this run's tiny-fixture decoding)"
        if args.schedule_file and not args.shape:
            args.schedule_file.write_text(json.dumps(schedules) + "\n")
            print(f"\nschedules written to {args.schedule_file}")
    if args.shape:
        print(run_shape(args, schedules, label), flush=True)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
