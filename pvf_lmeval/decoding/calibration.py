"""The calibration step (SPEC "Planning vocabulary"): threshold decoding that measures, at every
step, every in-band candidate of W_t \\ S_base as a planning branch that is never committed.

Rows per request: [z_base, z_plan_1..k] with the k candidates in position order (k varies per
request and step, up to the working-set size); ``max_rows`` caps the rows of one physical call
(the calls are counted). Each branch is verified by :func:`.verify.verify_plans`, the function the
PVF planning route uses, with entropies (A and VIG); z_base is committed with its stats.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .select import threshold_select
from .stats import Stats
from .step import Branches, Choice, Outcomes, Step, base_labels
from .verify import verify_plans


class CalibrationStep(Step):
    """Base rule: threshold at ``threshold`` over W_t (with ``reveal_next``); measured band
    ``band`` = [lo, hi); ``max_rows``: rows per physical call. ``events`` collects, per round,
    the :class:`.step.Outcomes` of every slot (with its request); ``rounds``, per request, the
    rounds it took part in."""

    name = "calibration"

    def __init__(self, params, band: tuple[float, float], reveal_next: int, max_rows: int):
        super().__init__(params)
        self.band = band
        self.reveal = reveal_next
        self.max_rows = max_rows
        ws = params.block_length * (2 if reveal_next > 0 else 1)
        self.rows = min(params.gen_length, ws) + 1
        self.events: list[tuple[Tensor, ...]] = []
        self.rounds: dict[int, int] = {}

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=None) -> Branches:
        W = b.working_set(y, self.reveal)
        sel, forced = threshold_select(st.conf, W, self.p.threshold)
        zb = torch.where(sel, st.tok, y)
        lo, hi = self.band
        cand = W & ~sel & (st.conf >= lo) & (st.conf < hi)
        order = torch.where(cand, cand.long().cumsum(-1) - 1, torch.full_like(y, b.L))
        j = torch.arange(self.rows - 1, device=y.device)
        own = order.unsqueeze(1) == j[:, None]                                   # [R, K, L]
        rows = torch.cat([zb.unsqueeze(1),
                          torch.where(own, st.tok.unsqueeze(1), zb.unsqueeze(1))], 1)
        k = cand.sum(-1)
        n = torch.where(b.finished(zb), torch.zeros_like(k), k + 1)
        return Branches(rows, n, base_labels(sel, forced), entropy=True,
                        memo=dict(W=W, zb=zb, own=own, k=k))

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        m = br.memo
        plans = Stats(out.tok[:, 1:], out.conf[:, 1:], out.pmax[:, 1:], out.pcur[:, 1:],
                      out.ent[:, 1:])
        v = verify_plans(out.row(0), plans, m["own"], m["W"] & (m["zb"] == b.mask_id),
                         self.p.threshold, reach=b.reach(m["own"]))
        K = m["own"].shape[1]
        kept = (torch.arange(K, device=y.device) < m["k"][:, None]) & (br.n > 0)[:, None]
        pos = m["own"].float().argmax(-1)                                        # [R, K]
        req = b.req[:, None].expand(-1, K)
        return Choice(torch.zeros_like(br.n), br.labels,
                      record=Outcomes(st.tok.gather(1, pos), v.nonvacuous, v.passed, v.vig, kept,
                                      req=req))

    def record(self, b, record: Outcomes) -> None:
        """A round's measurements, kept by the loop: rounds are counted here (the loop may drop
        a round's branches, never its choice)."""
        for i in b.ids:
            self.rounds[i] = self.rounds.get(i, 0) + 1
        self.events.append(record)
