"""``threshold``: Fast-dLLM confidence-threshold parallel decoding (SPEC decoder 2).

Commits every masked position of the active block with ``p >= threshold`` (or, with ``factor``
f, Fast-dLLM's factor rule: the n-th most confident needs ``p >= 1 - f/(n+1)``), and at least the
most confident one, labelled ``forced`` when nothing qualified. One single-row call per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .select import threshold_select
from .shared_params import FACTOR, THRESHOLD
from .stats import Stats
from .step import Branches, Step, base_labels, single_row

__all__ = ["ThresholdDecoder", "base_labels"]


class ThresholdDecoder(Step):
    name = "threshold"
    summary = ("Fast-dLLM: every position at or above threshold (or the factor rule), at least "
               "one")
    baseline = True
    reads = (THRESHOLD, FACTOR)

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=None) -> Branches:
        W = b.working_set(y)
        sel, forced = threshold_select(
            st.conf, W, self.p.threshold, self.p.factor,
            last_rank_commits_all=self.rules.factor_last_rank_commits_all)
        return single_row(b, torch.where(sel, st.tok, y), base_labels(sel, forced))
