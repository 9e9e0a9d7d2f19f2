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

from .select import rank_desc

#: the reference's caps of a round's drafts: ``min(max(floor(0.7 m), 5), 20)`` of m masks
DRAFT_SHARE, DRAFT_MIN, DRAFT_MAX = 0.7, 5, 20
#: the previous round's drafts at a block's start (bounds the first round's re-masks)
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
