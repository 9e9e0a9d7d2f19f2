"""``explore``: the paper's "Random vs Planning" ablation (SPEC fine print).

Each step commits the threshold set of W_t (forced rule included) plus exactly one extra masked
position of the active block, outside the threshold set, with ``band_lo <= p <= band_hi``:
``pick=random`` draws it uniformly; ``pick=planning`` draws uniformly among those whose ŷ is in
the planning vocabulary, falling back to random when there are none. Draws come from the request's
seeded generator (one uniform per generation position per step, drawn every step by the loop
before the step: ``Step.draws``). No
verification; one single-row call per step; the extra token is labelled ``explore``.
``rules=reference`` (switch 3): the most confident position is forced only when neither the
threshold set nor the extra pick commits anything.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .param_spec import Param, as_float
from .select import static_select, threshold_select
from .shared_params import REVEAL_NEXT, THRESHOLD
from .stats import Stats
from .step import EXPLORE, Branches, Step, base_labels, single_row


def parse_band(v) -> tuple[float, float]:
    """``band``: ``lo:hi`` (or a pair) with ``0 <= lo <= hi <= 1``."""
    msg = f"band={v!r} must be lo:hi with 0 <= lo <= hi <= 1"
    if isinstance(v, str):
        parts = v.split(":")
        if len(parts) != 2:
            raise ValueError(msg)
    elif isinstance(v, (tuple, list)) and len(v) == 2:
        parts = list(v)
    else:
        raise ValueError(msg)
    try:
        lo, hi = (as_float("band", x) for x in parts)
    except ValueError:
        raise ValueError(msg) from None
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(msg)
    return (lo, hi)


def _check_band(band: tuple[float, float]) -> None:
    lo, hi = band
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"band={lo}:{hi} must be lo:hi with 0 <= lo <= hi <= 1")


class ExploreDecoder(Step):
    name = "explore"
    summary = "threshold plus one position from a band, at random or by planning (ablation)"
    uses_vocab = True
    draws = True
    reads = (THRESHOLD,
             Param("pick", str, "random", "how it picks a position", choices=("random", "planning")),
             Param("band", tuple, (0.2, 0.6), "the confidence band it picks from", parse=parse_band,
                   check=_check_band, allowed="lo:hi with 0 <= lo <= hi <= 1"),
             REVEAL_NEXT)

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=None) -> Branches:
        p = self.p
        W = b.working_set(y, self.reveal)
        late = self.rules.force_after_routes    # rules=reference: force only if nothing else
        sel, forced = threshold_select(st.conf, W, p.threshold, force=not late)
        lo, hi = p.band
        elig = b.working_set(y) & ~sel & (st.conf >= lo) & (st.conf <= hi)
        pool = elig
        if p.pick == "planning":
            plan = elig & b.in_vocab(st.tok)
            pool = torch.where(plan.any(-1, keepdim=True), plan, elig)
        keys = torch.where(pool, draws[0], torch.full_like(st.conf, -1.0))
        extra = (b.idx == keys.argmax(-1, keepdim=True)) & pool
        if late:
            forced = static_select(st.conf, W, 1) & ~(sel | extra).any(-1, keepdim=True)
            sel = sel | forced
        labels = torch.where(extra, torch.full_like(sel, EXPLORE, dtype=torch.int8),
                             base_labels(sel, forced))
        return single_row(b, torch.where(sel | extra, st.tok, y), labels)

    def info(self, r: int, made_call: bool, br: Branches, choice) -> dict:
        return {"route": "explore"}
