"""Verification of planning branches (SPEC "PVF step" 3 and "Planning vocabulary"): the one
implementation that the PVF planning route, the online vocabulary and the calibration use.

For request r with base state z_base (stats ``base``) and planning branches z_plan_j (stats
``plans``), each the base state plus one candidate at its own position (``own``):

    S_imp  = positions of W_t still masked in z_base whose max probability under z_base is
             >= tau_high
    A_j    = 1 iff S_imp minus branch j's own position is non-empty (``nonvacuous``) and the
             argmax under z_plan_j equals the argmax under z_base at every position of it
    VIG_j  = A_j * mean over R_j of (H(z_base) - H(z_plan_j)), R_j = positions of W_t masked in
             z_base minus branch j's own position (0 when R_j is empty); only with entropies

On a block-diffusion model (block-causal attention) a candidate can influence only positions of
its own block and later ones: S_imp and R_j are restricted to those (``reach``), so that a
candidate in the revealed next block is verified on the next block's impact positions alone,
and is unverifiable (A_j = 0) when it has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .stats import Stats


@dataclass
class Verdict:
    """Per branch [R, K]: ``nonvacuous`` (non-empty impact set), ``passed`` (A), ``vig`` (None
    without entropies)."""

    nonvacuous: Tensor
    passed: Tensor
    vig: Tensor | None


def verify_plans(base: Stats, plans: Stats, own: Tensor, masked_base: Tensor,
                 tau_high: float, *, impact_over: Tensor | None = None,
                 reach: Tensor | None = None, rowsum=None) -> Verdict:
    """Verify K planning branches of R requests.

    ``base``: stats [R, L] of z_base; ``plans``: stats [R, K, L] of the branches; ``own``
    [R, K, L] bool: each branch's candidate position; ``masked_base`` [R, L]: positions of W_t
    still masked in z_base. VIG needs entropies in both ``base`` and ``plans``.

    ``impact_over`` (``rules=reference``, switch 4): the impact set is taken over these
    positions [R, L] (W_t masked before the base commit) with no position left out, and an empty
    impact set passes; ``nonvacuous`` still reports whether it was empty.

    ``reach`` [R, K, L] (block-diffusion models): the positions each branch's candidate can
    influence; the impact set and R_j of branch j are taken within them. ``rowsum``: the sum
    over the last dim VIG uses (default ``Tensor.sum(-1)``; the batch's, ``Batch.rowsum``).
    """
    if impact_over is None:
        imp = masked_base & (base.pmax >= tau_high)                    # S_imp [R, L]
        imp_j = imp.unsqueeze(1) & ~own                                 # [R, K, L]
    else:
        imp_j = (impact_over & (base.pmax >= tau_high)).unsqueeze(1).expand_as(own)
    if reach is not None:
        imp_j = imp_j & reach
    agree = ((plans.tok == base.tok.unsqueeze(1)) | ~imp_j).all(-1)
    nonvac = imp_j.any(-1)
    passed = agree if impact_over is not None else nonvac & agree
    vig = None
    if base.ent is not None and plans.ent is not None:
        R = masked_base.unsqueeze(1) & ~own                            # [R, K, L]
        if reach is not None:
            R = R & reach
        dH = torch.where(R, base.ent.unsqueeze(1) - plans.ent, torch.zeros_like(plans.ent))
        total = dH.sum(-1) if rowsum is None else rowsum(dH)
        vig = passed * total / R.sum(-1).clamp(min=1)
    return Verdict(nonvac, passed, vig)


def rows_of(st: Stats, a: int, b: int | None = None) -> Stats:
    """Stats of rows [a, b) of stats [R, M, L] (views)."""
    sl = slice(a, b)
    return Stats(st.tok[:, sl], st.conf[:, sl], st.pmax[:, sl], st.pcur[:, sl],
                 None if st.ent is None else st.ent[:, sl])
