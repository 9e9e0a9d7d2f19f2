"""The one decode loop and its result record (SPEC "Shared loop" and "Statistics").

Every request of a batch (one included) goes through the same rounds::

    stats = call([y])                          # NFE 1, on the initial canvas
    while some request still decodes:
        rows  = step.branches(y, stats)        # [R, M, L] + rows per request (0: no call)
        out   = call(rows)                     # one round of model calls for every request
        y, stats = step.choose(rows, out)      # the committed row and its stats, per request
        early stop, finished requests leave the batch

All of it runs as tensor operations over the live requests. The host reads one small tensor per
round: at the round's end, after the commit, the loop already builds the next round's branches
and their call layout (``Batch.plan``), and reads that layout together with the round's stop
positions and flags; the branches of requests that finished are then dropped. Outside the
rounds: the initial call's layout, round 0's, and at the end the finished requests' outputs,
one read each. After every commit the early-stop rule is applied: e = first end-of-text
position with every earlier position unmasked; every later position gets the token at e
(overwriting) and route None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..tensors.uploads import upload
from .batch import Batch
from .cache import cache_exact
from .common import AR, BASE, EXPLORE, FORCED, NONE, PLAN, ROUTE_NAMES
from .compiled import round_programs
from .round import next_round

#: exactly the keys of SPEC "Statistics", in order.
STAT_KEYS = ("nfe", "branch_rows", "gen_length", "gen_tokens", "committed", "tpf", "wall_s",
             "tps", "tokens_base", "tokens_plan", "tokens_ar", "tokens_forced", "tokens_explore")


@dataclass
class DecodeResult:
    """Outcome of decoding one request.

    tokens:      the ``gen_length`` generated ids (early-stop fill included).
    nfe:         model calls, the initial one included; branch_rows: sum of their batch rows.
    routes:      per generated position 'base'|'plan'|'ar'|'forced'|'explore', or None for
                 positions filled by early stop.
    committed:   tokens the decoder committed itself (positions with a route).
    gen_tokens:  tokens before the first end-of-text id (the LM may lower it for ``until``;
                 use ``dataclasses.replace``).
    wall_s:      wall seconds of decoding, device synchronised.
    early_stop:  whether the early-stop option was on.
    steps:       per-step trace records when decoding with ``trace=True``, else None.
    """

    tokens: list[int]
    nfe: int
    branch_rows: int
    routes: list[str | None]
    committed: int
    gen_tokens: int
    gen_length: int
    wall_s: float
    early_stop: bool
    tokens_base: int = 0
    tokens_plan: int = 0
    tokens_ar: int = 0
    tokens_forced: int = 0
    tokens_explore: int = 0
    decoder: str = ""
    steps: list[dict] | None = field(default=None, repr=False)
    #: planning candidates verified / passing the impact-set check (pvf); not in ``stats()``
    plan_tried: int = 0
    plan_passed: int = 0
    #: the model's attention block size (None: bidirectional); not in ``stats()``
    block_size: int | None = None
    #: whether the KV cache gives exactly the logits of uncached calls: no cache, or any cache
    #: on a block-diffusion model (finished blocks cannot see later ones); not in ``stats()``
    cache_exact: bool = True

    @property
    def tpf(self) -> float:
        return self.gen_tokens / self.nfe if self.nfe else 0.0

    @property
    def tps(self) -> float:
        return self.gen_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def stats(self) -> dict:
        """The SPEC "Statistics" record (exactly ``STAT_KEYS``)."""
        return {k: getattr(self, k) for k in STAT_KEYS}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(model, prompts: list[Tensor], params, step, *, request_indices: list[int] | None = None,
        repeat_indices: list[int] | None = None, trace: bool = False, vocab=None,
        invariant: bool = False) -> list[DecodeResult]:
    """Decode ``prompts`` (1-D long tensors on the model device) together with ``step`` (a
    decoder step object); results in order.

    ``vocab``: the planning vocabulary (``eligible_mask(tok)``; an online one also records),
    None for none. Wall time: every request is charged an equal share of the batch's wall
    time, so that ``tps`` (a ratio of sums) is the batch's throughput. ``invariant``: the
    decoding side's sums in a fixed order (batch-invariant decoding; the model's own kernels
    are the caller's to select).
    """
    n = len(prompts)
    if n == 0:
        return []
    request_indices = list(request_indices) if request_indices is not None else list(range(n))
    repeat_indices = list(repeat_indices) if repeat_indices is not None else [0] * n
    b = Batch(model, prompts, params, vocab=vocab, request_indices=request_indices,
              repeat_indices=repeat_indices, reveal=step.reveal, invariant=invariant)
    _sync(b.device)
    t0 = time.perf_counter()
    L, dev = b.L, b.device
    ids = list(range(n))
    y = b.initial()
    routes = torch.zeros((n, L), dtype=torch.int8, device=dev)
    tally = torch.zeros((n, 2), dtype=torch.long, device=dev)        # plan_tried, plan_passed
    ones = torch.ones(n, dtype=torch.long, device=dev)
    st = b.call(ids, y.unsqueeze(1), ones).pick(torch.zeros_like(ones))     # reads its layout
    b.commit_caches(ids, y)
    records = [[] for _ in range(n)] if trace else None
    finals: list[tuple[list[int], Tensor]] = []     # finished requests, outputs on the device
    settle, prepare = round_programs(getattr(model, "compile_round", None), _config(b, step))
    br, nxt = next_round(b, step, y, st)
    plan = _count_unmade(b, ids, nxt.tolist())                  # round 0's layout: one read
    t = 0
    while True:
        out = b.call(ids, br.rows, br.n, plan=plan, entropy=br.entropy, cover=br.cover,
                     max_rows=getattr(step, "max_rows", None))
        y, st, labels, made, routes, tally, e, finished, ch = settle(
            b, step, y, st, br, out, routes, tally)
        b.commit_caches(ids, y)
        # the next round's branches, for every live request (those that finish now are dropped
        # below), so that their layout comes with the stop flags in the round's one read
        nbr, host = prepare(b, step, y, st, e, finished, made)
        host = host.tolist()
        if records is not None:
            _trace(records, step, ids, t, b, labels, made, br, ch, host)
        t += 1
        for r, h in enumerate(host):
            if not h[1] and not h[2]:
                raise RuntimeError(f"decoder {step.name!r} made no call on an unfinished state")
        if any(h[1] for h in host):
            fill = (b.idx > e[:, None]) & (e[:, None] >= 0)
            y = torch.where(fill, y.gather(1, e.clamp(min=0)[:, None]), y)
            routes = torch.where(fill, torch.zeros_like(routes), routes)
            end = [r for r, h in enumerate(host) if h[1]]
            finals.append(([ids[r] for r in end], torch.cat([y, routes.long(), tally], 1)
                           .index_select(0, upload(end, dev))))
            keep = [r for r, h in enumerate(host) if not h[1]]
            ids, host = [ids[r] for r in keep], [host[r] for r in keep]
            if not ids:
                break
            kt = upload(keep, dev)
            y, routes, tally, st = (y.index_select(0, kt), routes.index_select(0, kt),
                                    tally.index_select(0, kt), st.select(kt))
            nbr = nbr.select(kt)
            b.live(ids)
        br = nbr
        plan = _count_unmade(b, ids, [h[3:] for h in host])
    done_at = _outputs(finals, n, L)                            # the finished requests: one read
    _sync(dev)
    share = (time.perf_counter() - t0) / n
    eos = set(int(i) for i in model.eos_ids)
    results = []
    L = params.gen_length
    for i in range(n):
        tokens, route_codes, (tried, passed) = done_at[i]
        tokens, route_codes = b.answer(i, tokens), b.answer(i, route_codes)
        counts = [route_codes.count(c) for c in range(len(ROUTE_NAMES))]
        gen_tokens = next((k for k, tk in enumerate(tokens) if tk in eos), L)
        results.append(DecodeResult(
            tokens=tokens, nfe=b.nfe[i], branch_rows=b.rows[i],
            routes=[ROUTE_NAMES[c] for c in route_codes], committed=L - counts[NONE],
            gen_tokens=gen_tokens, gen_length=L, wall_s=share, early_stop=b.early_stop,
            tokens_base=counts[BASE], tokens_plan=counts[PLAN], tokens_ar=counts[AR],
            tokens_forced=counts[FORCED], tokens_explore=counts[EXPLORE], decoder=step.name,
            steps=records[i] if records is not None else None, plan_tried=tried,
            plan_passed=passed, block_size=b.block_size,
            cache_exact=cache_exact(params.cache, b.block_size)))
    return results


def _config(b, step) -> tuple:
    """What the round's compiled programs hold constant (``compile_round``): the decoder and
    its parameters, and the batch's rules that do not depend on its requests."""
    vocab = b.vocab
    return (type(step), b.p, b.mask_id, b.block_size, b.invariant, type(vocab),
            getattr(vocab, "learning", None), getattr(vocab, "explore_slots", None))


def _count_unmade(b, ids: list[int], host: list[list[int]]) -> list[list[int]]:
    """Adds each live request's unmade calls (first column of its read row in ``host``) to its
    NFE; returns the rest of each row: the next call's layout (``Batch.plan``)."""
    for i, h in zip(ids, host):
        b.nfe[i] += h[0]
    return [h[1:] for h in host]


def _outputs(finals: list[tuple[list[int], Tensor]], n: int, L: int) -> list[tuple]:
    """(tokens, route codes, tally) of every request, from ``finals``: (requests, their rows
    [k, 2L + 2] of tokens, route codes and tally on the device) as they finished; one read."""
    rows = torch.cat([t for _, t in finals]).tolist()
    out: list[tuple | None] = [None] * n
    for i, h in zip((i for ids, _ in finals for i in ids), rows):
        out[i] = (h[:L], h[L:2 * L], h[2 * L:])
    return out


def _committed_positions(labels: list[int]) -> list[list]:
    return [[i, ROUTE_NAMES[c]] for i, c in enumerate(labels) if c]


def _trace(records, step, ids, t, b, labels, made, br, ch, host) -> None:
    """Append each live request's step record (trace mode only: reads per request)."""
    lab = labels.tolist()
    for r, i in enumerate(ids):
        e, _, call = host[r][:3]
        rec = {"step": t, "committed": _committed_positions(lab[r]), "nfe": b.nfe[i],
               "branch_rows": b.rows[i], "made_call": bool(call)}
        rec.update(step.info(r, bool(call), br, ch))
        if e >= 0:
            rec["early_stop_at"] = e
        records[i].append(rec)
