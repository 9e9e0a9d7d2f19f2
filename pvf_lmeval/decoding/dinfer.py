"""``hierarchy`` and ``credit``: dInfer's ``HierarchyDecoder`` and ``CreditThresholdParallelDecoder``
inside its ``BlockWiseDiffusionLLM`` loop (inclusionAI/dInfer ``python/dinfer/decoding/``;
docs/decoding.md).

Both commit masked positions of the active block from one single-row call per round:

- ``hierarchy``: per run of consecutive masked positions, every position holding the run's
  highest confidence when it is above ``low_threshold``; every position above ``threshold``; and
  the block's most confident position (all three strict, as the reference).
- ``credit``: a credit per position and token, accumulated across the block's calls (decayed
  by ``decay`` at every call after the first, plus ``p_top1 ** boost_gamma`` on the top-1 token
  of each masked position) and added to the logits as ``credit_alpha * log(1 + credit)``;
  positions whose fused argmax is the mask id wait; the others commit when their fused
  confidence is at least ``min(threshold, best - 1e-5)`` (best: the block's highest).

``rules=reference`` (switch ``unmade_extra_calls``, NFE only): dInfer checks a block between
unrolled windows of ``k = max(min(m // 8, 4), 1)`` calls (``m``: the block's masks when the window
opens); the calls of a window made after its block is complete are counted without being made.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .hooks import CallView, HookOut
from .param_spec import Param
from .shared_params import THRESHOLD
from .stats import Stats, log_softmax_fixed
from .step import Branches, Choice, Step, base_labels, single_row

#: dInfer's ``BlockWiseDiffusionLLM`` defaults: a window's calls per expected token, its cap
EXPECTED_TPF, MAXIMUM_UNROLL = 8, 4
#: the credit rule's margin below the best confidence (``get_transfer_index_threshold``)
NEAR_BEST = 1e-5

LOW_THRESHOLD = Param("low_threshold", float, 0.3, "the confidence a run's best "
                      "position needs", bounds="[0, 1]")
CREDIT_ALPHA = Param("credit_alpha", float, 0.7, "weight of log(1 + credit) added to "
                     "the logits", bounds=">= 0", finite=True)
BOOST_GAMMA = Param("boost_gamma", float, 0.2, "exponent of the top-1 probability a "
                    "call adds to the credit", bounds=">= 0", finite=True)
DECAY = Param("decay", float, 0.8, "factor of the credit at each call after a block's "
              "first", bounds="[0, 1]")


def hierarchy_select(conf: Tensor, members: Tensor, threshold: float,
                     low_threshold: float) -> Tensor:
    """dInfer's hierarchy rule over ``members`` [..., L] (the active block's masked positions):
    in each run of consecutive members, every member whose ``conf`` equals the run's highest
    (ties all) and is ``> low_threshold``; every member ``> threshold``; and the most confident
    member (first index on ties), whatever its confidence."""
    L = conf.shape[-1]
    prev = torch.cat([torch.zeros_like(members[..., :1]), members[..., :-1]], -1)
    run = torch.cumsum((members & ~prev).long(), -1)             # 1.. on members' runs
    run = torch.where(members, run, torch.zeros_like(run))       # 0: not a member
    key = torch.where(members, conf, torch.full_like(conf, float("-inf")))
    best = torch.full(conf.shape[:-1] + (L + 1,), float("-inf"), dtype=conf.dtype,
                      device=conf.device).scatter_reduce(-1, run, key, "amax")
    peak = members & (key == best.gather(-1, run)) & (conf > low_threshold)
    top = members & (torch.arange(L, device=conf.device) == key.argmax(-1, keepdim=True))
    return peak | (members & (conf > threshold)) | top


def credit_select(conf: Tensor, members: Tensor, threshold: float) -> Tensor:
    """dInfer's threshold rule on fused confidences: the members [..., L] with ``conf >=
    min(threshold, best - 1e-5)`` (best: the members' highest confidence), so when none reaches
    ``threshold`` every member within 1e-5 of the best commits; nothing without members."""
    key = torch.where(members, conf, torch.full_like(conf, float("-inf")))
    bar = (key.max(-1, keepdim=True).values - NEAR_BEST).clamp(-1000.0, threshold)
    return members & (key >= bar)


def window_size(masks: Tensor) -> Tensor:
    """Calls of one unrolled window for a block holding ``masks`` masks: ``max(min(masks // 8,
    4), 1)``."""
    return (masks // EXPECTED_TPF).clamp(1, MAXIMUM_UNROLL)


class _Unrolled(Step):
    """What the two dInfer steps share: the unrolled windows' accounting (``state["left"]``
    [R]: calls left in the active block's current window; 0: the next round opens one) and a
    round that commits ``select``'s positions of the active block."""

    loop_switches = ("stop_after_block", "argmax_over_mask")

    def start(self, b) -> dict | None:
        return {"left": torch.zeros(b.n, dtype=torch.long, device=b.device)}

    def select(self, b, st: Stats, W: Tensor) -> Tensor:
        raise NotImplementedError

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=None) -> Branches:
        W = b.working_set(y)
        # a position whose argmax is the mask id (argmax_over_mask) stays masked
        sel = self.select(b, st, W) & (st.tok != b.mask_id)
        row = torch.where(sel, st.tok, y)
        k = torch.where(state["left"] > 0, state["left"], window_size(W.sum(-1)))
        complete = ~(W & ~sel).any(-1)
        br = single_row(b, row, base_labels(sel, torch.zeros_like(sel)))
        br.memo = {"left": torch.where(complete, torch.zeros_like(k), k - 1),
                   "wasted": torch.where(complete, k - 1, torch.zeros_like(k))}
        return br

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        ch = Choice(torch.zeros_like(br.n), br.labels, state={"left": br.memo["left"]})
        if self.rules.unmade_extra_calls:
            ch.unmade = br.memo["wasted"]
        return ch


class HierarchyDecoder(_Unrolled):
    name = "hierarchy"
    summary = ("dInfer: each run of masks' best above low_threshold, every position above "
               "threshold, at least the block's best")
    reads = (THRESHOLD, LOW_THRESHOLD)

    def select(self, b, st: Stats, W: Tensor) -> Tensor:
        return hierarchy_select(st.conf, W, self.p.threshold, self.p.low_threshold)


class CreditDecoder(_Unrolled):
    name = "credit"
    summary = ("dInfer: confidences boosted by credit accumulated over a block's calls, "
               "committed at min(threshold, best)")
    reads = (THRESHOLD, CREDIT_ALPHA, BOOST_GAMMA, DECAY)

    def select(self, b, st: Stats, W: Tensor) -> Tensor:
        # positions whose argmax is the mask id neither commit nor set the best confidence
        return credit_select(st.conf, W & (st.tok != b.mask_id), self.p.threshold)

    def call_hook(self, b, view: CallView) -> HookOut:
        """The credit of every row's active block (carried from the request's last call on it,
        zero at the block's first call: positions outside the active block keep none) is
        decayed, then each open position's top-1 token gains ``p ** boost_gamma`` (``p`` its
        float32 probability under the raw logits); the statistics read the logits plus
        ``credit_alpha * log(1 + credit)``. The carry is the credit [N, P, V] (float32)."""
        lg = view.logits
        active = (view.gpos // b.B == view.block[:, None]) & view.inside                # [N, P]
        probs = (log_softmax_fixed(lg.float()).exp() if b.invariant
                 else torch.softmax(lg.float(), dim=-1))
        top_p, top = probs.max(dim=-1)
        credit = torch.zeros_like(probs) if view.carry is None else view.carry.float()
        credit = torch.where(active[..., None], credit * self.p.decay, torch.zeros_like(credit))
        gain = top_p.pow(self.p.boost_gamma) * (view.open & active).to(top_p.dtype)
        credit.scatter_add_(-1, top.unsqueeze(-1), gain.unsqueeze(-1))
        return HookOut(lg + self.p.credit_alpha * torch.log(credit + 1), carry=credit)
