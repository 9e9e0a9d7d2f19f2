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

from .param_spec import ROWS, Param
from .select import rank_desc, static_select, threshold_select
from .shared_params import FACTOR, THRESHOLD
from .stats import Stats
from .step import BASE, NONE, Branches, Choice, Step


def accept_chain_batched(sub: Tensor, D: Tensor) -> Tensor:
    """FreeDave acceptance for R requests at once: ``sub[r, b, j]`` [R, D+1, D+1] bool = draft j
    ⊆ target b, drafts j > ``D[r]`` absent. From best = 0, best moves to the largest j > best
    with ``sub[r, best, j]`` until there is none; returns best [R]. The chain moves at most D
    times."""
    R, n, _ = sub.shape
    j = torch.arange(n, device=sub.device)
    best = torch.zeros(R, dtype=torch.long, device=sub.device)
    for _ in range(n - 1):
        row = sub.gather(1, best.view(R, 1, 1).expand(R, 1, n)).squeeze(1)       # sub[best]
        ok = row & (j > best[:, None]) & (j <= D[:, None])
        best = torch.where(ok.any(-1), torch.where(ok, j, -1).max(-1).values, best)
    return best


class FreeDaveDecoder(Step):
    name = "freedave"
    summary = "static's trajectory, several steps drafted and verified in one call"
    reads = (Param("draft_steps", int, 4, "drafts per step", bounds=">= 1", cap=ROWS),
             Param("base_rule", str, "static", "the rule its drafts are checked against",
                   choices=("static", "threshold")),
             THRESHOLD.when(base_rule="threshold"), FACTOR.when(base_rule="threshold"))

    @staticmethod
    def rows_per_call(params) -> int:
        return params.draft_steps

    def _targets(self, b, drafts: Tensor, tok: Tensor, conf: Tensor) -> Tensor:
        """target_j [..., L]: each draft plus its base-rule commit from its own stats."""
        Wd = b.working_set(drafts)
        if self.p.base_rule == "static":
            sel = static_select(conf, Wd, 1)
        else:
            sel = threshold_select(
                conf, Wd, self.p.threshold, self.p.factor,
                last_rank_commits_all=self.rules.factor_last_rank_commits_all)[0]
        return torch.where(sel, tok, drafts)

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=None) -> Branches:
        W = b.working_set(y)
        rank = rank_desc(st.conf, W)
        D = torch.clamp(W.sum(-1), max=self.rows)                                  # [R]
        ks = torch.arange(self.rows + 1, device=y.device)                           # draft k
        write = rank.unsqueeze(1) < ks[:, None]                                     # [R, D+1, L]
        drafts = torch.where(write, st.tok.unsqueeze(1), y.unsqueeze(1))            # [0] = y
        n = torch.where(b.finished(drafts[:, 1]), torch.zeros_like(D), D)
        labels = torch.where(write[:, 1], BASE, NONE).to(torch.int8)
        return Branches(drafts[:, 1:], n, labels, memo={"write": write, "drafts": drafts, "D": D})

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats
               ) -> Choice:
        drafts, write, D = br.memo["drafts"], br.memo["write"], br.memo["D"]
        tok = torch.cat([st.tok.unsqueeze(1), out.tok], 1)
        conf = torch.cat([st.conf.unsqueeze(1), out.conf], 1)
        targets = self._targets(b, drafts, tok, conf)
        dmask = drafts == b.mask_id
        # sub[r, t, j]: every token draft j holds, target t holds identically
        sub = ((targets.unsqueeze(2) == drafts.unsqueeze(1)) | dmask.unsqueeze(1)).all(-1)
        best = accept_chain_batched(sub, D)
        lab = write.gather(1, best.view(-1, 1, 1).expand(-1, 1, write.shape[-1])).squeeze(1)
        labels = torch.where(lab, BASE, NONE).to(torch.int8)
        return Choice((best - 1).clamp(min=0), labels, memo={"best": best})

    def info(self, r: int, made_call: bool, br: Branches, choice: Choice) -> dict:
        out = {"route": "base", "drafts": int(br.memo["D"][r])}
        if made_call:
            out["accepted"] = int(choice.memo["best"][r])
        return out
