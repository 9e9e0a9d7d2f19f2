"""``joint``: LLaDA2.1's joint threshold, mask-to-token plus token-to-token editing (SGLang
``JointThreshold``, ``sglang/srt/dllm/algorithm/joint_threshold.py``, release 0.5.23).

A request holds one block at a time. Each round, from the previous call's argmax and its
probability: every mask of the block whose probability exceeds ``threshold`` takes the argmax
(mask to token; the most probable mask when none does), and every token the decoder wrote in the
block whose argmax differs and whose probability exceeds ``edit_threshold`` is rewritten (token
to token; ``edit_threshold=off``: never). After the block's last mask, editing rounds go on,
at most ``post_edit_steps`` of them; the block is released at the first round that changes
nothing (or when that budget is spent) and the next block starts from the same call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .select import rank_desc


def joint_transfers(tok: Tensor, conf: Tensor, y: Tensor, block: Tensor, fixed: Tensor,
                    mask_id: int, threshold: float, edit_threshold: float | None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """(m2t, t2t, forced) [..., L] of one round on states ``y`` [..., L] whose held block is
    ``block`` [..., L] (bool), from the argmax ``tok`` and its probability ``conf``:

    - m2t: masks of the block (not ``fixed``: the block's tokens when it was entered, a prompt's
      tail) with ``conf > threshold`` (strict), else the most probable one (``forced``; ties:
      the lower position, as the reference's ``topk`` on the CPU);
    - t2t: the block's other tokens, not ``fixed``, whose argmax differs from the token and
      ``conf > edit_threshold`` (strict; ``None``: editing off, nothing).
    """
    open_ = block & (y == mask_id) & ~fixed
    passed = open_ & (conf > threshold)
    forced = open_ & (rank_desc(conf, open_) == 0) & ~passed.any(-1, keepdim=True)
    if edit_threshold is None:
        t2t = torch.zeros_like(open_)
    else:
        t2t = block & ~open_ & ~fixed & (conf > edit_threshold) & (y != tok)
    return passed | forced, t2t, forced
