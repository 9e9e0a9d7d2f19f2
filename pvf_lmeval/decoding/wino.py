"""``wino``: WINO, wide-in narrow-out (Feng-Hong/WINO-DLLM ``LLaDA/decoding.py``,
``decoding_wino``).

Each round drafts every masked position of the active block whose confidence exceeds
``threshold`` (wide in: at most ``min(max(floor(0.7 m), 5), 20)`` of the block's m masks, the
most confident; the most confident one when none passes), and, when it drafted more than one,
masks again every position drafted in an earlier round of the block whose token a *shadow*
row finds improbable (narrow out: probability below ``back_threshold``; at most one fewer than
the previous round drafted, the least probable). A shadow row is a copy of the block's position
in the same call that sees the canvas but its own position (``tensors/shadow.py``), so it
checks the token there from its context alone. One model call per round over the canvas plus
the shadow of the active block; the block ends when no mask is left after a round.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .param_spec import Param, Rule
from .select import first_true, rank_desc
from .shared_params import THRESHOLD
from .stats import Stats
from .step import Branches, Choice, Step, base_labels, single_row

#: the reference's caps of a round's drafts: ``min(max(floor(0.7 m), 5), 20)`` of m masks
DRAFT_SHARE, DRAFT_MIN, DRAFT_MAX = 0.7, 5, 20
#: the reference's "previous round's drafts" before the first round (a block's first round has
#: nothing to verify, so it never bounds anything: the previous round's count carries over)
FIRST_LAST_ACCEPT = 30


def draft_cap(masks: Tensor) -> Tensor:
    """The most drafts of a round on a block with ``masks`` [...] masked positions: the
    reference's ``min(max(int(m * 0.7), 5), 20)``, its product in float32 as torch computes it."""
    return (masks.float() * DRAFT_SHARE).long().clamp(DRAFT_MIN, DRAFT_MAX)


def wino_drafts(conf: Tensor, W: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """(drafts, forced) [..., L]: the positions of ``W`` (the active block's masks) a round
    drafts from their confidences ``conf``: those with ``conf > threshold`` (strict), the
    :func:`draft_cap` most confident when more pass, else (none passes) the most confident one,
    ``forced``. Ties in confidence go to the lower position (the reference's ``topk`` has no
    defined order there; its ``argmax`` takes the first)."""
    passed = W & (conf > threshold)
    rank = rank_desc(conf, W)
    cap = draft_cap(W.sum(-1, keepdim=True))
    over = passed.sum(-1, keepdim=True) > cap
    forced = W & (rank == 0) & ~passed.any(-1, keepdim=True)
    return torch.where(over, W & (rank < cap), passed | forced), forced


def wino_remasks(pback: Tensor, verifiable: Tensor, back_threshold: float, drafted: Tensor,
                 last_accept: Tensor) -> Tensor:
    """[..., L] bool: the positions of ``verifiable`` (the block's positions that held a token
    in the state the call evaluated) a round masks again: those whose shadow probability
    ``pback`` is below ``back_threshold`` (strict), only when the round drafts more than one
    position (``drafted`` [..., 1]); when at least ``last_accept`` [..., 1] (the previous
    round's drafts) fail, only the ``last_accept - 1`` least probable (ties: the lower
    position)."""
    low = verifiable & (pback < back_threshold)
    many = low.sum(-1, keepdim=True) >= last_accept
    least = verifiable & (rank_desc(-pback, verifiable) < last_accept - 1)
    return torch.where(many, least, low) & (drafted > 1)


BACK_THRESHOLD = Param("back_threshold", float, None, "a drafted token whose shadow "
                       "probability is below it is masked again", bounds="[0, 1]",
                       none_means="0.9", exclusive=True)


def _no_guidance(p) -> str | None:
    if not p.cfg_scale:
        return None
    return (f"cfg_scale={p.cfg_scale}: wino verifies through a shadow block that the guided call "
            "does not compute; leave cfg_scale unset with decoder=wino")


class WinoDecoder(Step):
    name = "wino"
    summary = ("WINO: drafts above threshold, re-masks drafts a shadow copy of the block finds "
               "below back_threshold")
    reads = (THRESHOLD, BACK_THRESHOLD)
    checks = (Rule(_no_guidance, "cfg_scale", "wino: unset"),)
    defaults = {"threshold": 0.6}
    revocable = True
    caches = ("none",)
    loop_switches = ("argmax_over_mask", "softmax64")

    @classmethod
    def refuse(cls, model) -> str | None:
        if getattr(model, "logit_shift", 0):
            return (f"decoder=wino: {getattr(model, 'family', 'the model')} shifts its logits "
                    "(position j is read from the row at j - 1), so no shadow row predicts a "
                    "position without seeing its token; use a model without the shift (LLaDA, "
                    "LLaDA-MoE, LLaDA 2.x, SDAR)")
        return None

    def __init__(self, params):
        super().__init__(params)
        self.back = 0.9 if params.back_threshold is None else params.back_threshold

    def start(self, b) -> dict:
        n = b.n
        return {"last": torch.full((n,), FIRST_LAST_ACCEPT, dtype=torch.long, device=b.device),
                "fixed": b.initial() != b.mask_id}

    def branches(self, b, y: Tensor, st: Stats, state: dict, draws=()) -> Branches:
        masked = y == b.mask_id
        a = first_true(masked) // b.B                                      # active block [R]
        block = b.blk == a[:, None]
        W = masked & block
        # the call's shadow was this block's; a block's first round has nothing to verify
        verifiable = block & ~masked & ~state["fixed"]
        pback = st.pback if st.pback is not None else torch.ones_like(st.conf)
        drafts, forced = wino_drafts(st.conf, W, self.p.threshold)
        n = drafts.sum(-1, keepdim=True)
        remask = wino_remasks(pback, verifiable, self.back, n, state["last"][:, None])
        z = torch.where(remask, b.mask_id, torch.where(drafts, st.tok, y))
        zmask = z == b.mask_id
        br = single_row(b, z, base_labels(drafts, forced), settled=self.settled(b, zmask))
        br.shadow = (first_true(zmask) // b.B).clamp(max=b.nb - 1) * b.B
        br.memo = {"state": {"last": n.squeeze(-1), "fixed": state["fixed"]}}
        return br

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        return Choice(torch.zeros_like(br.n), br.labels, state=br.memo["state"])
