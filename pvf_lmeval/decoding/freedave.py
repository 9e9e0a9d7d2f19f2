"""``freedave``: draft-and-verify on the static trajectory (SPEC decoder 3).

Draft k (k = 1..D, D = min(draft_steps, masks left in the active block)) is ``y`` plus ``ŷ`` at
its top-k most confident masked positions of the active block; one batched call over drafts
1..D. ``target_j`` = draft j plus what the base rule (static: the single most confident masked
position; threshold: the threshold rule) commits within draft j's own active block from draft
j's own stats (draft 0 = ``y``). Acceptance chain: from best = 0, repeatedly move to the largest
j > best with draft j ⊆ target_best. Commit draft best (labels ``base``); its stats feed the next
step. No call when draft 1 is already finished (no mask left / early stop).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import BASE, NONE, Stats, StepResult, rank_desc, static_select, threshold_select
from .params import DecodeParams


def accept_chain(sub: list[list[bool]]) -> int:
    """FreeDave acceptance: ``sub[b][j]`` = draft j ⊆ target b; returns the final ``best``."""
    best, n = 0, len(sub)
    while True:
        nxt = [j for j in range(best + 1, n) if sub[best][j]]
        if not nxt:
            return best
        best = max(nxt)


class FreeDaveDecoder:
    name = "freedave"

    def __init__(self, params: DecodeParams):
        self.D = params.draft_steps
        self.rule = params.base_rule
        self.tau = params.threshold
        self.factor = params.factor

    def _targets(self, ctx, drafts: Tensor, tok: Tensor, conf: Tensor) -> Tensor:
        """target_j [D+1, L]: each draft plus its base-rule commit from its own stats."""
        Wd = ctx.working_set(drafts)
        if self.rule == "static":
            sel = static_select(conf, Wd, 1)
        else:
            sel = threshold_select(conf, Wd, self.tau, self.factor)[0]
        return torch.where(sel, tok, drafts)

    def step(self, ctx, y: Tensor, st: Stats) -> StepResult:
        yg = ctx.gen(y)
        W = ctx.working_set(yg)
        rank = rank_desc(st.conf, W)
        left = int(W.sum().item())
        D = min(self.D, left)
        ks = torch.arange(D + 1, device=y.device).unsqueeze(1)            # draft k, k = 0..D
        write = rank.unsqueeze(0) < ks                                    # [D+1, L]
        drafts = torch.where(write, st.tok.unsqueeze(0), yg.unsqueeze(0))  # drafts[0] = y
        info = {"route": "base", "drafts": D}
        if ctx.finished(drafts[1]):
            labels = torch.where(write[1], BASE, NONE).to(torch.int8)
            return StepResult(ctx.with_gen(y, drafts[1]), labels, None, info)
        rows = y.unsqueeze(0).repeat(D, 1)
        ctx.gen(rows)[:] = drafts[1:]
        s = ctx.forward(rows)
        tok = torch.cat([st.tok.unsqueeze(0), s.tok])
        conf = torch.cat([st.conf.unsqueeze(0), s.conf])
        targets = self._targets(ctx, drafts, tok, conf)
        dmask = drafts == ctx.mask_id
        # sub[b, j]: every token draft j holds, target b holds identically
        sub = ((targets.unsqueeze(1) == drafts.unsqueeze(0)) | dmask.unsqueeze(0)).all(-1)
        best = accept_chain(sub.tolist())
        info["accepted"] = best
        labels = torch.where(write[best], BASE, NONE).to(torch.int8)
        return StepResult(rows[best - 1], labels, s.row(best - 1), info)
