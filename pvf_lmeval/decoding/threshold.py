"""``threshold``: Fast-dLLM confidence-threshold parallel decoding (SPEC decoder 2).

Commits every masked position of the active block with ``p >= threshold`` (or, with ``factor``
f, Fast-dLLM's factor rule: the n-th most confident needs ``p >= 1 - f/(n+1)``), and at least the
most confident one, labelled ``forced`` when nothing qualified. One single-row call per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import BASE, FORCED, NONE, Stats, StepResult, threshold_select
from .params import DecodeParams


def base_labels(sel: Tensor, forced: Tensor) -> Tensor:
    """int8 route codes [L]: ``forced`` where forced, ``base`` where selected, else none."""
    return torch.where(forced, FORCED, torch.where(sel, BASE, NONE)).to(torch.int8)


class ThresholdDecoder:
    name = "threshold"

    def __init__(self, params: DecodeParams):
        self.tau = params.threshold
        self.factor = params.factor

    def step(self, ctx, y: Tensor, st: Stats) -> StepResult:
        yg = ctx.gen(y)
        W = ctx.working_set(yg)
        sel, forced = threshold_select(st.conf, W, self.tau, self.factor)
        zg = torch.where(sel, st.tok, yg)
        return ctx.commit_single(y, zg, base_labels(sel, forced), {"route": "base"})
