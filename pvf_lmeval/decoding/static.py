"""``static``: LLaDA low-confidence remasking (SPEC decoder 1).

Each step commits the most confident masked position(s) of the active block: one per step by
default (``steps = L``), or the LLaDA per-block schedule when ``steps < L``. Labels: ``base``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import BASE, NONE, Stats, StepResult, llada_count, static_select
from .params import DecodeParams


class StaticDecoder:
    name = "static"

    def __init__(self, params: DecodeParams):
        self.steps_per_block = None if params.steps is None else params.steps // params.num_blocks

    def step(self, ctx, y: Tensor, st: Stats) -> StepResult:
        yg = ctx.gen(y)
        W = ctx.working_set(yg)
        k = 1
        if self.steps_per_block is not None:
            left = int(W.sum().item())
            # blocks start fully masked for static, so m = B masks at the block start
            k = min(left, llada_count(ctx.B, self.steps_per_block, ctx.B - left))
        sel = static_select(st.conf, W, k)
        zg = torch.where(sel, st.tok, yg)
        labels = torch.where(sel, BASE, NONE).to(torch.int8)
        return ctx.commit_single(y, zg, labels, {"route": "base"})
