"""The planning vocabulary a decoder reads: one interface for a fixed id set or online statistics.

    eligible_mask(tok) -> bool tensor of tok's shape: the ids planning may use now
    explore_slots: int          verification slots reserved for explorable ids (0: none)
    learning: bool              whether outcomes are recorded (the call then computes entropies)
    explorable_mask(tok), record(tok, nonvacuous, passed, vig, keep=None)   (online only)

:class:`FixedVocab` is an artifact's (or a caller's) id set; ``online.OnlineVocab`` learns its
set while decoding.
"""

from __future__ import annotations

import torch
from torch import Tensor


class FixedVocab:
    """A fixed planning vocabulary: token ids (any iterable of ints; empty = plan nothing)."""

    explore_slots = 0
    learning = False

    def __init__(self, ids, device="cpu"):
        self.ids = tuple(sorted({int(i) for i in ids}))
        self._t = torch.tensor(self.ids, dtype=torch.long, device=device)

    def eligible_mask(self, tok: Tensor) -> Tensor:
        if not self.ids:
            return torch.zeros_like(tok, dtype=torch.bool)
        return torch.isin(tok, self._t.to(tok.device))

    def eligible_ids(self) -> list[int]:
        return list(self.ids)
