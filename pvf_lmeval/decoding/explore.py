"""``explore``: the paper's "Random vs Planning" ablation (SPEC fine print).

Each step commits the threshold set of W_t (forced rule included) plus exactly one extra masked
position of the active block, outside the threshold set, with ``band_lo <= p <= band_hi``:
``pick=random`` draws it uniformly; ``pick=planning`` draws uniformly among those whose ŷ is in
the planning vocabulary, falling back to random when there are none. Draws come from the request's
seeded generator (one uniform per generation position per step, drawn every step). No
verification; one single-row call per step; the extra token is labelled ``explore``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import EXPLORE, Stats, StepResult, threshold_select
from .params import DecodeParams
from .threshold import base_labels


class ExploreDecoder:
    name = "explore"

    def __init__(self, params: DecodeParams):
        self.p = params

    def step(self, ctx, y: Tensor, st: Stats) -> StepResult:
        p = self.p
        yg = ctx.gen(y)
        W = ctx.working_set(yg, p.reveal_next)
        sel, forced = threshold_select(st.conf, W, p.threshold)
        lo, hi = p.band
        elig = ctx.working_set(yg) & ~sel & (st.conf >= lo) & (st.conf <= hi)
        pool = elig
        if p.pick == "planning":
            plan = elig & ctx.in_vocab(st.tok)
            pool = torch.where(plan.any(), plan, elig)
        keys = torch.where(pool, ctx.rand(ctx.L), torch.full_like(st.conf, -1.0))
        extra = (ctx.idx == keys.argmax()) & pool
        labels = base_labels(sel, forced)
        labels = torch.where(extra, torch.full_like(labels, EXPLORE), labels)
        zg = torch.where(sel | extra, st.tok, yg)
        return ctx.commit_single(y, zg, labels, {"route": "explore"})
