"""The table models the reference decoders' outputs in ``tests/data/reference_decoders/`` were
computed on (``table0``, ``table1``, ``table2``), rebuilt from their published description
(tests/data/reference_decoders/README.md) as models of the decoding protocol.

A row's logits depend on its absolute position, its own token and the tokens at the positions
before and after it and at position 0 *as the row sees them*: a masked token, a position outside
the tokens given, or one the row cannot attend to (block-causal attention, ``block_size``) is
seen as nothing (index V). Tables are drawn, in this order, with float32 ``torch.randn`` from
``torch.Generator().manual_seed(seed)``: T0 [256, V], T_self, T_left, T_right, T_first
[V + 1, V]; ``logits = sharp * (T0[pos] + 0.6 T_self[own] + T_left[left] + T_right[right]
+ 0.5 T_first[first])`` with the mask id's entry set to -4 before the scaling (the float32
operations in that order).
"""

from __future__ import annotations

import torch

V, MASK, EOS, MAX_POS, SHARP = 12, 11, 10, 256, 2.0


class ReferenceTable:
    """``table<seed>`` of the reference harnesses; ``block_size``: block-causal attention over
    absolute blocks of that size (the harness's aligned geometry), None: bidirectional."""

    mask_id = MASK
    eos_ids = (EOS,)

    def __init__(self, seed: int, block_size: int | None = None):
        g = torch.Generator().manual_seed(seed)
        self.T0 = torch.randn(MAX_POS, V, generator=g)
        self.T_self, self.T_left, self.T_right, self.T_first = (
            torch.randn(V + 1, V, generator=g) for _ in range(4))
        self.block_size = block_size
        self.calls = 0

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        assert cache is None and attention_mask is None
        self.calls += 1
        N, T = tokens.shape
        pos = positions.expand(N, -1) if positions.dim() == 1 else positions       # [N, P]
        seen = torch.where(tokens == MASK, V, tokens)                              # [N, T]
        padded = torch.cat([seen, torch.full((N, 1), V)], 1)                       # T: nothing

        def at(p):
            ok = (p >= 0) & (p < T)
            if self.block_size is not None:
                ok &= p // self.block_size <= pos // self.block_size
            return padded.gather(1, torch.where(ok, p, T))

        row = (self.T0[pos] + 0.6 * self.T_self[at(pos)] + self.T_left[at(pos - 1)]
               + self.T_right[at(pos + 1)] + 0.5 * self.T_first[at(torch.zeros_like(pos))])
        row[..., MASK] = -4.0
        return SHARP * row
