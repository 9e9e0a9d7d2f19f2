"""End-to-end batched decoding: the real decode loop per decoder x cache x batch size.

Part 1 (tiny fixtures, held-out `arith` items): for each decoder (pvf and explore with the `arith`
preset and the bundled vocabulary), cache mode and batch size (default 1, 4, 16, 32), the items are
decoded in batches of that size with ``decode_batch`` and every ``model.logits`` call is timed
(device synchronised before and after). Reported: answer tokens per second (ratio of sums), mean
NFE per request, rounds of the loop (one ``Runner.call`` each), physical model calls, wall time
split into inside / outside model calls, the outside time per round and its ratio to batch 1 of
the same decoder and cache (the host cost of a round should not grow with the batch), and two
parts of the outside time that are data work proportional to the rows rather than host
overhead: the statistics over the vocabulary and the KV cache commits (docs/benchmarks.md,
"Batched decoding", says what counts as the model call).

``--clock cpu`` measures every figure of part 1 in CPU seconds of the decoding thread
(``time.thread_time``) instead of wall seconds: with one torch thread on a CPU every operation
runs on that thread, so the split inside / outside the model no longer depends on what else
the machine runs (other processes' load inflates wall time by up to 2x on a shared machine).
Not for GPUs (the thread sleeps while it waits for the device).

Part 2 (``--replay SHAPE``): a randomly initialised model of a real shape (or a reduced one, see
``REPLAY_SHAPES``) replays the per-request call schedules recorded in part 1 at batch size 1
(each request: the rows of each of its calls, full or cached, and the block it was in), with
requests batched the way ``Runner.call`` pools them: per round, the full calls of all live
requests as one model call and the cached ones as another, each request with its own KV cache.
Every batch size replays the same requests (the largest batch's worth), in consecutive groups
of that size, once untimed (so that a compiled model has compiled every shape of that size) and
once timed. Reported: aggregate tokens per second per batch size (every request counted as
producing ``--gen-length`` tokens). Random weights decide nothing, which is why schedules are replayed.

Shadow (``--shadow SHAPE``, instead of parts 1 and 2): the real loop at a real model's cost. The
first fixture's logits decide, and every model call is also made, with the same rows, positions,
cache mode and cache state, by a randomly initialised model of SHAPE (``SHADOW_SHAPES``; see
``bench/shadow.py``), whose vocabulary the statistics pass runs over. For each decoder, cache
mode and batch size, the first ``--limit`` held-out items of ``--task`` (``--requests-per-size``:
only the first max(K, batch) of them) are decoded in batches formed as ``generate_until`` forms
them (longest prompt first). Reported: per-request tokens/s (a request's answer tokens over its
batch's wall, ratio of sums), aggregate tokens/s and its ratio to batch 1, the bound the calls
alone set (answer tokens over the shadow's call time: the loop costing nothing), the share of
the wall outside the shadow's calls and the outside ms per round. The fixture's own calls are
subtracted from the wall.

    python bench/e2e.py --fixtures tiny-llada --limit 32 --clock cpu # CPU
    python bench/e2e.py --replay llada-8b/8 --json out.json          # + reduced 8B-shape replay
    python bench/e2e.py --shadow llada-8b/16 --task arith --limit 4 --batch-sizes 1 4   # CPU
    python bench/e2e.py --shadow llada-8b --task arith_var --device cuda --compile    # GPU
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchlib import DECODERS, decode_batch, make_params
from benchlib import runner as runner_mod
from benchlib import load_model, DiffusionLM, compile_seconds, cache_segments, is_cached_call

import benchlib
from benchlib import KVCache, call_view, random_model, sync
import shadow as shadow_mod

CACHES = ("none", "prefix", "dual")
BATCH_SIZES = (1, 4, 16, 32)
#: the shapes part 2 replays (``benchlib.SHAPES``: the real LLaDA-8B shape, and the same shape with
#: width, depth and vocabulary divided by 8 or 16)
REPLAY_SHAPES = ("llada-8b", "llada-8b/8", "llada-8b/16")
#: the shapes the shadow runs at (``benchlib.SHAPES``; the reduced ones are CPU-sized)
SHADOW_SHAPES = ("llada-8b", "dream-7b", "llada-8b/8", "llada-8b/16")
SHADOW_DECODERS = ("pvf", "threshold")


#: the clock of part 1 (``--clock``): wall seconds, or CPU seconds of the decoding thread
CLOCK = time.perf_counter


class TimedModel:
    """Wraps a model: times every ``logits`` call (synchronised), counts calls, and records each
    call's rows per request (``schedule``: request -> [(rows, cached, block)])."""

    def __init__(self, model, block_length: int):
        self.model, self.B = model, block_length
        self.inside = 0.0
        self.calls = 0
        self.record = False
        self.P0 = 0
        self.requests: list[int] = []
        self.schedule: dict[int, list] = defaultdict(list)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        if self.record:     # batch size 1: every call is the current request's
            cached = is_cached_call(cache_segments(cache, tokens.shape[0]))
            block = (int(positions.reshape(-1)[0]) - self.P0) // self.B
            self.schedule[self.requests[0]].append((int(tokens.shape[0]), cached, block))
        sync(self.model.device)
        t0 = CLOCK()
        out = self.model.logits(tokens, positions, attention_mask=attention_mask, cache=cache)
        sync(self.model.device)
        self.inside += CLOCK() - t0
        self.calls += 1
        return out


class Timer:
    """Times calls of functions ``names`` (attributes of ``owner``, missing ones skipped) with
    ``CLOCK`` while active."""

    def __init__(self, owner, names):
        self.seconds = 0.0
        self.owner = owner
        self._orig = {n: getattr(owner, n, None) for n in names}

    def __enter__(self):
        for name, fn in self._orig.items():
            if fn is None:
                continue

            def timed(*a, _fn=fn, **k):
                t0 = CLOCK()
                out = _fn(*a, **k)
                self.seconds += CLOCK() - t0
                return out
            setattr(self.owner, name, timed)
        return self

    def __exit__(self, *exc):
        for name, fn in self._orig.items():
            if fn is not None:
                setattr(self.owner, name, fn)


def stats_timer() -> Timer:
    """The per-row statistics over the vocabulary (``stats_from_logits``, entropies): work
    proportional to rows x positions x vocabulary, outside the model call but not host overhead."""
    return Timer(runner_mod, ("stats_from_logits", "compiled_stats_from_logits",
                              "entropy_from_logits"))


def cache_commit_timer() -> Timer:
    """Keeping the committed rows' keys/values after full calls (``Runner.commit_caches``): a
    copy of every refreshing request's keys/values (bytes proportional to the requests) plus
    the bookkeeping around it (per request in checkouts before the batched cache layout)."""
    return Timer(runner_mod.Runner, ("commit_caches",))


class RoundCounter:
    """Counts ``Runner.call`` invocations (rounds of the loop, the initial call included)."""

    def __init__(self):
        self.n = 0
        self._orig = runner_mod.Runner.call

    def __enter__(self):
        orig = self._orig

        def counted(runner, *a, **k):
            self.n += 1
            return orig(runner, *a, **k)
        runner_mod.Runner.call = counted
        return self

    def __exit__(self, *exc):
        runner_mod.Runner.call = self._orig


def compile_options(args, *, network: bool = False) -> dict:
    """decode_batch's compile arguments for ``--compile-step``/``--compile-round``; ``network``:
    the network is compiled too, and with it the statistics pass (as the adapter's ``compile``
    does)."""
    return dict(compile_step={} if args.compile_step or network else None,
                compile_round={} if args.compile_round else None)


def params_for(dec: str, cache: str, args, model, vocab_cache: dict):
    extra = {}
    if getattr(DECODERS[dec], "uses_vocab", dec in ("pvf", "explore")):
        extra["preset"] = "arith"
        if "ids" not in vocab_cache:
            from benchlib import resolve_vocab_for
            vocab_cache["ids"], _ = resolve_vocab_for(model, task_family="math-word")
        extra["plan_vocab"] = vocab_cache["ids"]
    return make_params(dec, gen_length=args.gen_length, block_length=args.block_length,
                       cache=cache, **extra)


def run_fixture(name: str, args, docs) -> tuple[list[dict], dict]:
    base = load_model(name, device=args.device)
    opts = compile_options(args)
    prompts = benchlib.prompt_ids(base.tokenizer, docs)
    model = TimedModel(base, args.block_length)
    rows, schedules, vocab_cache = [], {}, {}
    for dec in args.decoders:
        for cache in args.caches:
            params = params_for(dec, cache, args, base, vocab_cache)
            decode_batch(base, prompts[:2], params=params, **opts)              # warm-up
            if args.compile_step or args.compile_round:     # the compiled graphs of size 1 too
                decode_batch(base, prompts[:1], params=params, **opts)
            for bs in args.batch_sizes:
                model.inside, model.calls = 0.0, 0
                model.record = bs == 1
                model.schedule = defaultdict(list)
                results = []
                with RoundCounter() as rc, stats_timer() as stt, cache_commit_timer() as kvt:
                    sync(base.device)
                    t0 = CLOCK()
                    for a in range(0, len(prompts), bs):
                        chunk = prompts[a:a + bs]
                        model.P0 = max(len(p) for p in chunk)
                        model.requests = list(range(a, a + len(chunk)))
                        results += decode_batch(model, chunk, params=params,
                                                request_indices=model.requests, **opts)
                    sync(base.device)
                    wall = CLOCK() - t0
                if bs == 1:
                    schedules[(dec, cache)] = dict(model.schedule)
                tokens = sum(r.gen_tokens for r in results)
                outside = wall - model.inside
                rows.append({
                    "fixture": name, "decoder": dec, "cache": cache, "batch": bs,
                    "requests": len(results), "tokens_per_s": tokens / wall,
                    "nfe": sum(r.nfe for r in results) / len(results),
                    "rounds": rc.n, "calls": model.calls, "wall_s": wall,
                    "inside_s": model.inside, "outside_s": outside,
                    "outside_share": outside / wall,
                    "outside_ms_per_round": 1000 * outside / rc.n if rc.n else float("nan"),
                    "outside_ms_per_call": 1000 * outside / max(model.calls, 1),
                    "stats_s": stt.seconds, "cache_commit_s": kvt.seconds,
                    "rest_ms_per_round": 1000 * (outside - stt.seconds) / rc.n if rc.n else float("nan"),
                    "host_ms_per_round": (1000 * (outside - stt.seconds - kvt.seconds) / rc.n
                                          if rc.n else float("nan")),
                    "inside_ms_per_call": 1000 * model.inside / max(model.calls, 1)})
                print(json.dumps(rows[-1]), flush=True)
    return rows, schedules


def table(rows: list[dict], title: str) -> str:
    """Outside-model time per round (per call for checkouts without rounds) and its parts:
    statistics over the vocabulary, cache commits, and the rest ("host": deciding, assembling,
    bookkeeping), each against batch 1 of the same fixture, decoder and cache."""
    key = "outside_ms_per_round" if all(r["rounds"] for r in rows) else "outside_ms_per_call"
    unit = "round" if key == "outside_ms_per_round" else "call"
    b1 = {(r["fixture"], r["decoder"], r["cache"]): r for r in rows if r["batch"] == 1}

    def vs(r, k):
        ref = b1.get((r["fixture"], r["decoder"], r["cache"]))
        return f"{r[k] / ref[k]:.2f}x" if ref and ref.get(k) and r.get(k) == r.get(k) else "-"

    out = [title, "",
           "| fixture | decoder | cache | batch | tokens/s | NFE | rounds | calls | outside share "
           f"| outside ms/{unit} | vs batch 1 | statistics ms | cache commits ms "
           "| outside less statistics, vs batch 1 | host ms | host vs batch 1 | inside ms/call |",
           "|" + "---|" * 17]
    for r in rows:
        n = max(r["rounds"] or r["calls"], 1)
        out.append(f"| {r['fixture']} | {r['decoder']} | {r['cache']} | {r['batch']} | "
                   f"{r['tokens_per_s']:.1f} | {r['nfe']:.1f} | {r['rounds'] or '-'} | "
                   f"{r['calls']} | {100 * r['outside_share']:.0f}% | {r[key]:.2f} | "
                   f"{vs(r, key)} | {1000 * r['stats_s'] / n:.2f} | "
                   f"{1000 * r.get('cache_commit_s', 0.0) / n:.2f} | "
                   f"{vs(r, 'rest_ms_per_round') if r['rounds'] else '-'} | "
                   f"{r['host_ms_per_round']:.2f} | "
                   f"{vs(r, 'host_ms_per_round') if r['rounds'] else '-'} | "
                   f"{r['inside_ms_per_call']:.2f} |")
    return "\n".join(out)


# ---------------------------------------------------------------- batched replay


def replay_batched(model, schedules: list[list], cache: str, prompt_len: int, L: int, B: int,
                   device) -> float:
    """Seconds to replay ``schedules`` (one per request: [(rows, cached, block)]) batched: per
    round, every live request's next call; full and cached calls of a round pooled separately."""
    g = torch.Generator().manual_seed(1)
    V = model.vocab_size - 3
    R = len(schedules)
    y = torch.cat([torch.randint(4, V, (R, prompt_len), generator=g),
                   torch.full((R, L), model.mask_id)], 1).to(device)
    caches = [None] * R
    if cache != "none":
        caches = [KVCache(cache, prompt_len=prompt_len, gen_length=L, block_length=B,
                          mask_id=model.mask_id, reveal_next=0, device=device) for _ in range(R)]
    rounds = max(len(s) for s in schedules)
    sync(device)
    t0 = time.perf_counter()
    for t in range(rounds):
        groups = {True: [], False: []}
        for i, s in enumerate(schedules):
            if t < len(s):
                rows, cached, block = s[t]
                groups[bool(cached and caches[i] is not None and caches[i].kv is not None)].append(
                    (i, rows, min(block, L // B - 1)))
        for cached, members in groups.items():
            if not members:
                continue
            seg, toks, pos = [], [], []
            for i, rows, block in members:
                s0 = prompt_len + block * B
                hi = min(prompt_len + L, s0 + 2 * B)
                c = caches[i]
                if c is not None:
                    if cached:
                        c.span = (s0, prompt_len + L if cache == "prefix" else s0 + B)
                        hi = min(hi, c.span[1])
                    else:
                        c.start_full(y[i, prompt_len:].unsqueeze(0).expand(rows, -1))
                seg.append((c, rows))
                toks.append(y[i].unsqueeze(0).expand(rows, -1))
                pos.append((s0, hi, rows))
            P = max(hi - s0 for s0, hi, _ in pos)
            positions = torch.cat([torch.clamp(torch.arange(s0, s0 + P), max=hi - 1)
                                   .unsqueeze(0).expand(n, -1) for s0, hi, n in pos]).to(device)
            model.logits(torch.cat(toks), positions, cache=call_view(seg, len(positions)))
            for i, rows, block in members:
                c = caches[i]
                if c is not None and not cached:
                    c.commit(y[i, prompt_len:])
                s0 = prompt_len + block * B
                y[i, s0 + t % B] = 7              # later canvases differ
    sync(device)
    return time.perf_counter() - t0


def run_replay(args, schedules: dict) -> list[dict]:
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    model = random_model(args.replay, args.device, dtype)
    if args.compile:
        model.compile("blocks")
    out = []
    n_req = max(args.batch_sizes)
    for (dec, cache), sched in schedules.items():
        per_req = [sched[k] for k in sorted(sched)]
        # The same requests at every batch size (the recorded ones, cycled to the largest batch),
        # replayed in consecutive groups of that size.
        reqs = (per_req * (1 + n_req // max(len(per_req), 1)))[:n_req]
        base_tps = None
        for bs in args.batch_sizes:
            def one_pass() -> float:
                return sum(replay_batched(model, reqs[g:g + bs], cache, args.prompt_len,
                                          args.gen_length, args.block_length, args.device)
                           for g in range(0, len(reqs), bs))

            one_pass()      # warm-up: every shape of this batch size (compiles them, if compiled)
            secs = one_pass()
            tps = len(reqs) * args.gen_length / secs
            base_tps = base_tps or tps
            out.append({"shape": args.replay, "decoder": dec, "cache": cache, "batch": bs,
                        "requests": len(reqs), "tokens_per_s": tps, "vs_batch_1": tps / base_tps,
                        "seconds": secs})
            print(json.dumps(out[-1]), flush=True)
    return out


def replay_table(rows: list[dict], title: str) -> str:
    out = [title, "", "| decoder | cache | batch | aggregate tokens/s | vs batch 1 |",
           "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['decoder']} | {r['cache']} | {r['batch']} | {r['tokens_per_s']:.1f} | "
                   f"{r['vs_batch_1']:.2f}x |")
    return "\n".join(out)


# ---------------------------------------------------------------- shadow


def shadow_model(shape: str, device, dtype) -> DiffusionLM:
    return random_model(shape, device, dtype)


def run_shadow(args, docs) -> tuple[list[dict], str]:
    """Rows of the shadow table (see the module docstring) and the table's note."""
    from benchlib import batches

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    fixture = load_model(args.fixtures[0], device=dev)
    big = shadow_model(args.shadow, dev, dtype)
    if args.compile:
        big.compile(args.compile_scope)
    opts = compile_options(args, network=args.compile)
    model = shadow_mod.ShadowModel(fixture, big)
    prompts = benchlib.prompt_ids(fixture.tokenizer, docs)
    rows, vocab_cache = [], {}
    for dec in args.decoders:
        for cache in args.caches:
            params = params_for(dec, cache, args, fixture, vocab_cache)
            base = None
            for k, bs in enumerate(args.batch_sizes):
                n = len(prompts) if not args.requests_per_size else min(
                    len(prompts), max(args.requests_per_size, bs))
                order = batches([0] * n, [len(p) for p in prompts[:n]], bs)
                try:
                    # one warm-up at the first size and one at the first size above 1
                    warm = k == 0 or (bs > 1 and all(b == 1 for b in args.batch_sizes[:k]))
                    row = shadow_row(model, prompts, order, params, dev, warm=warm, opts=opts)
                except torch.OutOfMemoryError:
                    row = {"oom": True}
                    torch.cuda.empty_cache()
                row.update({"shape": args.shadow, "fixture": args.fixtures[0], "task": args.task,
                            "decoder": dec, "cache": cache, "batch": bs, "requests": n})
                if not row.get("oom"):
                    base = base or row["aggregate_tps"]
                    row["vs_batch_1"] = row["aggregate_tps"] / base
                rows.append(row)
                print(json.dumps(row), flush=True)
    where = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
             else f"cpu, torch threads {torch.get_num_threads()}")
    compiled = ("compile=" + args.compile_scope if args.compile
                else "statistics compiled" if args.compile_step else "eager")
    compiled += ", round compiled" if args.compile_round else ""
    note = (f"random {args.shadow} ({str(dtype).replace('torch.', '')}, {compiled}, {where}) "
            f"shadowing {args.fixtures[0]} on held-out {args.task} items, gen_length "
            f"{args.gen_length}, block_length {args.block_length}")
    return rows, note


def shadow_row(model, prompts, order, params, dev, *, warm: bool, opts: dict) -> dict:
    """Decode the batches ``order`` (lists of prompt indices) through the shadow ``model``; the
    timed figures of one table row. ``warm``: decode the first batch once untimed first (the
    compiled graphs are dynamic beyond size 1: one warm-up at size 1 and one above serve all).
    ``opts``: decode_batch's compile arguments."""
    warmup_s = compile_s = None
    if warm:        # its wall and the part of it torch.compile spent compiling: the warm-up
        c0 = compile_seconds()
        sync(dev)
        t0 = time.perf_counter()
        decode_batch(model, [prompts[i] for i in order[0]], params=params,
                     request_indices=order[0], **opts)
        sync(dev)
        warmup_s, c1 = time.perf_counter() - t0, compile_seconds()
        compile_s = None if c0 is None or c1 is None else c1 - c0
    model.fixture_s = model.inside_s = 0.0
    model.calls = 0
    tokens, wall, latency, nfe = 0, 0.0, 0.0, 0
    with RoundCounter() as rc, stats_timer() as stt:
        for b in order:
            sync(dev)
            tb, fix0 = time.perf_counter(), model.fixture_s
            res = decode_batch(model, [prompts[i] for i in b], params=params,
                               request_indices=b, **opts)
            sync(dev)
            wall_b = time.perf_counter() - tb - (model.fixture_s - fix0)
            wall += wall_b
            latency += wall_b * len(res)
            tokens += sum(r.gen_tokens for r in res)
            nfe += sum(r.nfe for r in res)
    n = sum(len(b) for b in order)
    outside = wall - model.inside_s
    row = {"nfe": nfe / n, "rounds": rc.n, "calls": model.calls,
           "tokens": tokens, "wall_s": wall, "inside_s": model.inside_s,
           "fixture_s": model.fixture_s, "stats_s": stt.seconds,
           "per_request_tps": tokens / latency,
           "aggregate_tps": tokens / wall,
           "bound_tps": tokens / model.inside_s,
           "outside_share": outside / wall,
           "outside_ms_per_round": 1000 * outside / max(rc.n, 1),
           "stats_ms_per_round": 1000 * stt.seconds / max(rc.n, 1),
           "warmup_s": warmup_s, "compile_s": compile_s}
    return row


def shadow_table(rows: list[dict], note: str) -> str:
    out = [f"Decode loop on the shadow of {note}", "",
           "| shadow | decoder | cache | batch | requests | NFE | rounds | per-request tokens/s "
           "| aggregate tokens/s | vs batch 1 | calls-only bound tokens/s | outside share "
           "| outside ms/round | statistics ms/round | warm-up s (compiling) |",
           "|" + "---|" * 15]
    for r in rows:
        if r.get("oom"):
            out.append(f"| {r['shape']} | {r['decoder']} | {r['cache']} | {r['batch']} | "
                       f"{r['requests']} | out of memory |" + " |" * 9)
            continue
        out.append(f"| {r['shape']} | {r['decoder']} | {r['cache']} | {r['batch']} | "
                   f"{r['requests']} | {r['nfe']:.1f} | {r['rounds']} | "
                   f"{r['per_request_tps']:.1f} | {r['aggregate_tps']:.1f} | "
                   f"{r['vs_batch_1']:.2f}x | {r['bound_tps']:.1f} | "
                   f"{100 * r['outside_share']:.0f}% | {r['outside_ms_per_round']:.2f} | "
                   f"{r['stats_ms_per_round']:.2f} | {_warm_cell(r)} |")
    return "\n".join(out)


def _warm_cell(r: dict) -> str:
    """The warm-up decode's wall seconds and, in brackets, torch.compile's part of it (blank
    for a row without a warm-up; "?" where torch keeps no compile record)."""
    if r.get("warmup_s") is None:
        return ""
    c = "?" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"
    return f"{r['warmup_s']:.1f} ({c})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_arguments(ap, limit_default=32, task_option=True)
    ap.add_argument("--decoders", nargs="+", default=None,
                    help=f"default: every decoder ({', '.join(SHADOW_DECODERS)} with --shadow)")
    ap.add_argument("--caches", nargs="+", default=None,
                    help="default: none, prefix, dual (dual with --shadow)")
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=list(BATCH_SIZES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--replay", choices=REPLAY_SHAPES, default=None)
    ap.add_argument("--prompt-len", type=int, default=64, help="replay: prompt tokens")
    ap.add_argument("--shadow", choices=SHADOW_SHAPES, default=None,
                    help="the loop at SHAPE's cost (instead of parts 1 and 2)")
    ap.add_argument("--requests-per-size", type=int, default=None,
                    help="shadow: each batch size decodes the first max(K, batch) items only")
    ap.add_argument("--compile", action="store_true",
                    help="replay, shadow: compile the random model (--compile-scope)")
    ap.add_argument("--compile-scope", choices=("blocks", "model", "true"), default="true",
                    help="true: the device's fastest (models.diffusion_lm.COMPILE_TRUE)")
    ap.add_argument("--compile-step", action="store_true",
                    help="the statistics pass compiled, the network eager (part 1: the "
                         "fixture's; shadow: the shadow's)")
    ap.add_argument("--compile-round", action="store_true",
                    help="the round's step compiled (compile_round=true; part 1 and shadow)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="part 1: wall seconds, or CPU seconds of the decoding thread (one "
                         "torch thread, CPU only)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    benchlib.task_gen_length(args)
    bad = [c for c in args.caches or () if c not in CACHES + ("dual_base",)]
    if bad:
        ap.error(f"--caches {bad[0]!r} must be one of {', '.join(CACHES + ('dual_base',))}")
    bad = [d for d in args.decoders or () if d not in DECODERS]
    if bad:
        ap.error(f"--decoders {bad[0]!r} must be one of {', '.join(DECODERS)}")
    if args.shadow and args.replay:
        ap.error("--shadow and --replay are separate runs: give one")
    if args.replay and "dual_base" in (args.caches or ()):
        ap.error("--replay does not replay cache=dual_base; measure it with --shadow")
    if args.shadow and args.clock == "cpu":
        ap.error("--clock cpu is for parts 1 and 2; --shadow measures wall seconds")
    args.decoders = args.decoders or list(SHADOW_DECODERS if args.shadow else DECODERS)
    args.caches = args.caches or (["dual"] if args.shadow else list(CACHES))
    if args.clock == "cpu" and (args.threads != 1 or torch.device(args.device).type != "cpu"):
        ap.error("--clock cpu needs --device cpu and --threads 1 (every operation on the "
                 "decoding thread)")
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    docs = benchlib.held_out(args.limit, args.task)
    if args.shadow:
        rows, note = run_shadow(args, docs)
        print("\n" + shadow_table(rows, note))
        if args.json:
            args.json.write_text(json.dumps({"note": note, "shadow": rows}, indent=1))
        return
    note = (f"{len(docs)} held-out {args.task} items, gen_length {args.gen_length}, block_length "
            f"{args.block_length}, device {args.device}, torch threads {torch.get_num_threads()}, "
            f"{'round compiled, ' if args.compile_round else ''}"
            f"{'CPU seconds of the decoding thread' if args.clock == 'cpu' else 'wall seconds'}")
    print(note, flush=True)
    rows, schedules = [], {}
    for name in args.fixtures:
        r, s = run_fixture(name, args, docs)
        rows += r
        if name == args.fixtures[0]:
            schedules = s
    print("\n" + table(rows, f"Decode loop, {note}"))
    replay_rows = []
    if args.replay:
        replay_rows = run_replay(args, schedules)
        print("\n" + replay_table(replay_rows, f"Batched replay on random {args.replay} "
                                  f"({'compile=blocks' if args.compile else 'eager'}), schedules "
                                  f"of {args.fixtures[0]}, prompt {args.prompt_len}"))
    if args.json:
        args.json.write_text(json.dumps({"note": note, "loop": rows, "replay": replay_rows},
                                        indent=1))


if __name__ == "__main__":
    main()
