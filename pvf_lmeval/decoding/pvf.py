"""``pvf``: Plan-Verify-Fill (SPEC "PVF step").

Per step, from the stats of ``y`` on the working set W_t:

1. base: ``S_base`` = threshold set of W_t (forced top-1 if empty); ``z_base``. If ``z_base`` is
   finished (no mask / early stop) it is committed with no call.
2. planning candidates: W_t \\ S_base with ŷ in the planning vocabulary and
   plan_lo <= p < plan_hi, top ``width`` by p (ties by index).
3. planning route (candidates exist): one call on [z_base, z_plan_1..K]; impact set
   S_imp = W_t masked in z_base with max prob under z_base >= threshold; branch j is verified iff
   S_imp minus its own candidate is non-empty and its argmax equals z_base's there (and, with
   ``plan_self_check``, its candidate keeps p >= plan_lo at its own position). The verified branch
   with the largest C_total (sum of max prob over W_t positions still masked in it; ties → the
   earlier branch) is committed, else z_base. No AR attempt in that step.
4. AR fallback (no candidates): the leftmost min(width, eligible) positions of W_t \\ S_base
   with p >= ar_lo; nested branches z_ar_0..z_ar_K in one call; fill r is verified iff the argmax
   at i_r under z_ar_{r-1} equals ŷ_{i_r}; commit z_ar_{k*} (k* = longest verified prefix).
5. otherwise a single-row call on [z_base].

Routes switched off by ``routes``: ``plan`` (never AR), ``ar`` (never planning), ``none``.
Labels: base / forced / plan / ar.

Online vocabulary (``ctx.online``, see :mod:`.online`): candidates are the eligible in-band
positions plus up to ``explore`` slots of explorable ones (which also fill slots the eligible
ones leave unused); every tried candidate's outcome (non-vacuous, A, VIG from the entropies of the
same call) is recorded for the vocabulary's next update, never applied inside the request.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import (AR, PLAN, Stats, StepResult, first_true, leftmost_positions,
                     static_select, threshold_select, top_positions)
from .params import DecodeParams
from .threshold import base_labels


class PVFDecoder:
    name = "pvf"

    def __init__(self, params: DecodeParams):
        self.p = params
        self.use_plan = params.routes in ("plan+ar", "plan")
        self.use_ar = params.routes in ("plan+ar", "ar")

    def step(self, ctx, y: Tensor, st: Stats) -> StepResult:
        p = self.p
        yg = ctx.gen(y)
        W = ctx.working_set(yg, p.reveal_next)
        sel, forced = threshold_select(st.conf, W, p.threshold)
        zb = torch.where(sel, st.tok, yg)
        labels = base_labels(sel, forced)
        z_base = ctx.with_gen(y, zb)
        if ctx.finished(zb):
            return StepResult(z_base, labels, None, {"route": "base"})

        rest = W & ~sel
        none = torch.zeros_like(rest)
        band = rest & (st.conf >= p.plan_lo) & (st.conf < p.plan_hi) if self.use_plan else none
        elig = rest & (st.conf >= p.ar_lo) if self.use_ar else none
        online = ctx.online
        if online is not None and self.use_plan and online.explore_slots > 0:
            cand = band & online.eligible_mask(st.tok)
            expl = band & online.explorable_mask(st.tok)
            n_cand, n_ar, n_x = torch.stack([cand.sum(), elig.sum(), expl.sum()]).tolist()
            k_x = min(n_x, online.explore_slots)              # reserved exploration slots
            k_e = min(n_cand, p.width - k_x)
            k_x = min(n_x, p.width - k_e)                     # ... which also fill unused ones
            if k_x > 0:
                cand = static_select(st.conf, cand, k_e) | static_select(st.conf, expl, k_x)
                n_cand = k_e + k_x
        else:
            cand = band & ctx.in_vocab(st.tok)
            n_cand, n_ar = torch.stack([cand.sum(), elig.sum()]).tolist()
        k_plan, k_ar = min(p.width, n_cand), min(p.width, n_ar)
        if k_plan > 0:
            return self._plan(ctx, st, W, zb, z_base, labels, cand, k_plan)
        if k_ar > 0:
            return self._ar(ctx, st, z_base, labels, elig, k_ar)
        s = ctx.forward(z_base.unsqueeze(0))
        return StepResult(z_base, labels, s.row(0), {"route": "base"})

    def _plan(self, ctx, st: Stats, W: Tensor, zb: Tensor, z_base: Tensor, labels: Tensor,
              cand: Tensor, k: int) -> StepResult:
        p = self.p
        pos = top_positions(st.conf, cand, k)                           # [k], rank order
        rows = z_base.unsqueeze(0).repeat(k + 1, 1)                     # [z_base, z_plan_1..k]
        j = torch.arange(1, k + 1, device=rows.device)
        rows[j, ctx.P0 + pos] = st.tok[pos]
        learn = ctx.online is not None and ctx.online.learning
        s = ctx.forward(rows, entropy=learn)
        own = torch.zeros((k, ctx.L), dtype=torch.bool, device=rows.device)
        own[j - 1, pos] = True
        masked_b = W & (zb == ctx.mask_id)
        imp = masked_b & (s.pmax[0] >= p.threshold)                     # S_imp [L]
        imp_j = imp.unsqueeze(0) & ~own                                 # [k, L]
        agree = ((s.tok[1:] == s.tok[0].unsqueeze(0)) | ~imp_j).all(-1)
        nonvac = imp_j.any(-1)
        ok = nonvac & agree                                             # A_j [k]
        if learn:
            R = masked_b.unsqueeze(0) & ~own                            # [k, L]
            dH = torch.where(R, s.ent[0].unsqueeze(0) - s.ent[1:], torch.zeros_like(s.ent[1:]))
            vig = ok * dH.sum(-1) / R.sum(-1).clamp(min=1)
            ctx.online.record(st.tok[pos], nonvac, ok, vig)
        if p.plan_self_check:
            ok &= s.pcur[j, pos] >= p.plan_lo
        live = W.unsqueeze(0) & (ctx.gen(rows) == ctx.mask_id)           # [k+1, L]
        c_total = torch.where(live, s.pmax, torch.zeros_like(s.pmax)).sum(-1)
        score = torch.where(ok, c_total[1:], torch.full_like(c_total[1:], float("-inf")))
        best = first_true(score == score.max())                         # tie: earlier branch
        any_ok, b, n_ok = torch.stack([ok.any().long(), best, ok.sum()]).tolist()
        ctx.plan_tried += k
        ctx.plan_passed += n_ok
        info = {"route": "plan" if any_ok else "base"}
        if ctx.trace:
            info.update(candidates=pos.tolist(), verified=ok.tolist(),
                        c_total=c_total[1:].tolist())
        if not any_ok:
            return StepResult(z_base, labels, s.row(0), info)
        labels = labels.clone()
        labels[pos[b]] = PLAN
        return StepResult(rows[b + 1], labels, s.row(b + 1), info)

    def _ar(self, ctx, st: Stats, z_base: Tensor, labels: Tensor, elig: Tensor, k: int
            ) -> StepResult:
        pos = leftmost_positions(elig, k)                               # [k] ascending
        n = torch.arange(k + 1, device=z_base.device)
        fill = n.unsqueeze(1) > torch.arange(k, device=z_base.device).unsqueeze(0)  # [k+1, k]
        rows = z_base.unsqueeze(0).repeat(k + 1, 1)                     # z_ar_0..z_ar_k
        cols = ctx.P0 + pos
        rows[:, cols] = torch.where(fill, st.tok[pos].unsqueeze(0), rows[:, cols])
        s = ctx.forward(rows)
        ver = s.tok[n[:-1], pos] == st.tok[pos]                         # fill r under z_ar_{r-1}
        kstar = int(torch.cumprod(ver.long(), 0).sum().item())
        info = {"route": "ar" if kstar else "base"}
        if ctx.trace:
            info.update(candidates=pos.tolist(), verified=ver.tolist())
        labels = labels.clone()
        labels[pos[:kstar]] = AR
        return StepResult(rows[kstar], labels, s.row(kstar), info)
