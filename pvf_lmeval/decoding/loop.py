"""The shared decode loop and its result record (SPEC "Shared loop" and "Statistics").

    stats = forward([y])                      # NFE 1, on the initial canvas
    while y has a mask (and not stopped early):
        y, stats = step(y, stats)             # at most one (batched) call per step

After every commit the early-stop rule is applied: e = first end-of-text position with every
earlier position unmasked; every later position gets the token at e (overwriting) and route None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .common import AR, BASE, EXPLORE, FORCED, NONE, PLAN, ROUTE_NAMES
from .context import Ctx

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


def _committed_positions(labels: Tensor) -> list[list]:
    nz = torch.nonzero(labels).flatten()
    return [[i, ROUTE_NAMES[c]] for i, c in zip(nz.tolist(), labels[nz].tolist())]


def run_loop(model, prompt: Tensor, params, decoder, *, request_index: int = 0,
             repeat_index: int = 0, trace: bool = False, online=None, batch=None) -> DecodeResult:
    """Decode one request: ``prompt`` [P0] long on the model device, ``decoder`` a step object.

    ``online``: an ``OnlineVocab`` the planning route consults and records into (its statistics
    only change when its owner calls ``update()`` between requests).
    ``batch``: the request's handle in a batched run (``batch.run_batch``), else None."""
    ctx = Ctx(model, prompt, params, request_index=request_index, repeat_index=repeat_index,
              trace=trace, online=online, batch=batch)
    _sync(ctx.device)
    t0 = time.perf_counter()
    y = torch.cat([prompt, torch.full((ctx.L,), ctx.mask_id, dtype=torch.long,
                                      device=ctx.device)])
    routes = torch.zeros(ctx.L, dtype=torch.int8, device=ctx.device)
    records: list[dict] | None = [] if trace else None
    st = ctx.forward(y.unsqueeze(0)).row(0)
    ctx.committed(y)
    t = 0
    while True:
        res = decoder.step(ctx, y, st)
        y = res.y
        ctx.committed(y)
        routes = torch.where(res.labels != NONE, res.labels, routes)
        yg = ctx.gen(y)
        e, has_mask = torch.stack([ctx.stop_index(yg),
                                   (yg == ctx.mask_id).any().long()]).tolist()
        if records is not None:
            rec = {"step": t, "committed": _committed_positions(res.labels), "nfe": ctx.nfe,
                   "branch_rows": ctx.rows, "made_call": res.stats is not None}
            rec.update(res.info)
            if e >= 0:
                rec["early_stop_at"] = e
            records.append(rec)
        t += 1
        if e >= 0:
            yg[e + 1:] = yg[e]
            routes[e + 1:] = NONE
            break
        if not has_mask:
            break
        if res.stats is None:
            raise RuntimeError(f"decoder {decoder.name!r} made no call on an unfinished state")
        st = res.stats
    _sync(ctx.device)
    wall = time.perf_counter() - t0
    tokens = ctx.gen(y).tolist()
    eos = set(int(i) for i in model.eos_ids)
    gen_tokens = next((i for i, tk in enumerate(tokens) if tk in eos), ctx.L)
    counts = torch.bincount(routes.long(), minlength=len(ROUTE_NAMES)).tolist()
    return DecodeResult(
        tokens=tokens, nfe=ctx.nfe, branch_rows=ctx.rows,
        routes=[ROUTE_NAMES[c] for c in routes.tolist()],
        committed=ctx.L - counts[NONE], gen_tokens=gen_tokens, gen_length=ctx.L, wall_s=wall,
        early_stop=ctx.early_stop, tokens_base=counts[BASE], tokens_plan=counts[PLAN],
        tokens_ar=counts[AR], tokens_forced=counts[FORCED], tokens_explore=counts[EXPLORE],
        decoder=decoder.name, steps=records, plan_tried=ctx.plan_tried,
        plan_passed=ctx.plan_passed)
