"""The planning vocabulary a decoder reads: one interface for a fixed id set or online statistics.

    eligible_mask(tok) -> bool tensor of tok's shape: the ids planning may use now
    explore_slots: int          verification slots reserved for explorable ids (0: none)
    learning: bool              whether outcomes are recorded (the call then computes entropies)
    explorable_mask(tok), record(tok, nonvacuous, passed, vig, keep=None)   (online only)

:class:`FixedVocab` is an artifact's (or a caller's) id set; ``online.OnlineVocab`` learns its
set while decoding.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from ..tensors.uploads import upload

_CAPITALISED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def capitalised_ids(tokenizer) -> frozenset[int]:
    """Ids whose decoded text, stripped of whitespace, starts with an upper-case letter.

    ``rules=reference`` (switch 2 of ``decoding.rules``): the PVF authors' code treats such a
    token (a name or a sentence opening, e.g. " Emma", "The") as a planning token besides the
    vocabulary. Special tokens are left out. Decodes every id once (about a second on a
    150k-token vocabulary), cached per tokenizer object."""
    try:
        return _CAPITALISED[tokenizer]
    except (KeyError, TypeError):
        pass
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    out = []
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i]).strip()
        if text and text[0].isupper():
            out.append(i)
    ids = frozenset(out)
    try:
        _CAPITALISED[tokenizer] = ids
    except TypeError:       # a tokenizer without weak references: not cached
        pass
    return ids


class FixedVocab:
    """A fixed planning vocabulary: token ids (any iterable of ints; empty = plan nothing)."""

    explore_slots = 0
    learning = False

    def __init__(self, ids, device="cpu"):
        self.ids = tuple(sorted({int(i) for i in ids}))
        self._t = upload(self.ids, device)

    def eligible_mask(self, tok: Tensor) -> Tensor:
        if not self.ids:
            return torch.zeros_like(tok, dtype=torch.bool)
        return torch.isin(tok, self._t.to(tok.device))

    def eligible_ids(self) -> list[int]:
        return list(self.ids)
