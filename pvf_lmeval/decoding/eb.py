"""``eb``: entropy-bound sampling (EB-sampler, arXiv 2505.24857; SGLang ``EBSampling``).

Each round orders the open positions of the active block by the entropy of their distribution
(nats, mask token excluded) and commits the lowest-entropy one, then every next one while the
summed entropy of the positions ordered before it is at most ``gamma`` (inclusive). The
entropies being non-negative, the committed set is a prefix of that order. One single-row
call per round; nothing is revoked.

``rules=reference``: SGLang's extra call on every completed block (its logits are unused) is
counted without being made (switch ``unmade_extra_calls``), and a request stops after the block
that holds end-of-text (switch ``stop_after_block``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .param_spec import Param
from .stats import Stats
from .step import Branches, Choice, Step, base_labels, single_row

GAMMA = Param("gamma", float, 0.15, "entropy bound: the summed entropy (nats) of the positions "
              "committed before the last one", bounds=">= 0", finite=True)


def entropy_bound_select(ent: Tensor, W: Tensor, gamma: float) -> Tensor:
    """[..., L] bool: the positions of ``W`` [..., L] an entropy bound ``gamma`` commits, from
    their entropies ``ent`` [..., L]: the lowest, and each next in ascending order (ties by
    position) while the exclusive prefix sum of the entropies before it is ``<= gamma``.
    Nothing where ``W`` is empty."""
    L = ent.shape[-1]
    key = torch.where(W, ent, torch.full_like(ent, float("inf")))
    order = torch.sort(key, dim=-1, stable=True).indices
    sorted_ent = key.gather(-1, order)
    before = torch.cumsum(sorted_ent, dim=-1)                 # inf past the members: no commit
    take = torch.cat([torch.ones_like(before[..., :1], dtype=torch.bool),
                      before[..., :-1] <= gamma], dim=-1)
    take &= torch.arange(L, device=ent.device) < W.sum(-1, keepdim=True)
    return torch.zeros_like(W).scatter(-1, order, take)


class EntropyBoundDecoder(Step):
    name = "eb"
    summary = ("entropy bound (SGLang EBSampling): the lowest-entropy positions while the "
               "entropy summed before each stays within gamma")
    reads = (GAMMA,)
    entropy = True
    loop_switches = ("stop_after_block",)

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=()) -> Branches:
        W = b.working_set(y)
        sel = entropy_bound_select(st.ent, W, self.p.gamma)
        br = single_row(b, torch.where(sel, st.tok, y), base_labels(sel, torch.zeros_like(sel)))
        br.entropy = True
        if self.rules.unmade_extra_calls:     # the block's last commit: SGLang calls once more
            br.memo["completes"] = (W.any(-1) & ~(W & ~sel).any(-1)).long()
        return br

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        return Choice(torch.zeros_like(br.n), br.labels, unmade=br.memo.get("completes"))
