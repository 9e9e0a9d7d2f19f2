"""``subblock``: Fast-dLLM v2's sub-block decoding (NVlabs/Fast-dLLM ``v2/generation_functions.py``,
``batch_sample``; docs/decoding.md).

The active block is decoded sub-block by sub-block (``sub_block`` positions each, aligned to the
block's start), left to right: only the masked positions of the first sub-block that still holds
one are candidates; those with ``p >= threshold`` are committed (``p > threshold`` under
``rules=reference``, switch ``strict_threshold``), and at least the most confident (``forced``
when nothing else qualified). A block whose first position is still masked commits that position
alone, by argmax (Fast-dLLM v2's token after a completed block, taken from the call on the
completed block: here the loop's call on the committed state). One single-row call per round.

``rules=reference`` (switch ``unmade_extra_calls``, NFE only): the reference's prompt prefill
(on a block-diffusion model, a prompt longer than a block whose end is not block-aligned) and
its completion call after the last block (unless that block holds end-of-text and early stop is
on) are counted without being made; every other completion call is this decoder's own next
call, whose stats give the next block's first token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tensors.uploads import upload
from .param_spec import POSITIONS, Param, Rule
from .select import first_true, threshold_select
from .shared_params import THRESHOLD
from .stats import Stats
from .step import BASE, Branches, Choice, Step, base_labels, single_row

SUB_BLOCK = Param("sub_block", int, 8, "positions of a sub-block",
                  bounds=">= 1", cap=POSITIONS)


def _divides(p) -> str | None:
    if p.block_length % p.sub_block == 0:
        return None
    return f"sub_block={p.sub_block} must divide block_length={p.block_length}"


def subblock_set(masked: Tensor, block: int, sub: int) -> tuple[Tensor, Tensor]:
    """(candidates [..., L], first [..., L]) of states whose masked positions are ``masked``
    [..., L]: the masked positions of the first sub-block (``sub`` positions, aligned to multiples
    of ``sub``) that holds one, and that sub-block's first masked position where it starts a
    block of ``block`` (the block's first token, committed alone by argmax). Nothing when no
    position is masked."""
    L = masked.shape[-1]
    idx = torch.arange(L, device=masked.device)
    f = first_true(masked).unsqueeze(-1)                                          # L: none
    first = (idx == f) & (f % block == 0)
    return masked & (idx // sub == f // sub), first


class SubBlockDecoder(Step):
    name = "subblock"
    summary = ("Fast-dLLM v2: the threshold rule inside the first sub-block with a mask; a "
               "block's first token by argmax")
    reads = (THRESHOLD, SUB_BLOCK)
    checks = (Rule(_divides, "sub_block", "a divisor of block_length"),)
    loop_switches = ("stop_after_block", "argmax_over_mask")

    def start(self, b) -> dict | None:
        """``prefill`` [n] long: the reference's prompt prefill call (``rules=reference``), a
        prompt with a whole block before its region on a block-diffusion model, the region not
        starting at a block."""
        zero = torch.zeros(b.n, dtype=torch.long, device=b.device)
        if not self.rules.unmade_extra_calls or b.block_size is None:
            return {"prefill": zero}
        head = (b.P0 - (b.attention[:, :b.P0] == 0).sum(-1) if b.attention is not None
                else torch.full_like(zero, b.P0))
        start = upload(b.start, b.device)
        return {"prefill": ((head > 0) & (start < b.B)).long()}

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=None) -> Branches:
        W, first = subblock_set(y == b.mask_id, b.B, self.p.sub_block)
        # a first token whose argmax is the mask id (argmax_over_mask) leaves its block to the
        # sub-block rule, as the reference's next call does
        first &= st.tok != b.mask_id
        alone = first.any(-1, keepdim=True)
        sel, forced = threshold_select(st.conf, W & ~alone, self.p.threshold,
                                       strict=self.rules.strict_threshold)
        sel = (sel | first) & (st.tok != b.mask_id)      # a commit of the mask id changes nothing
        br = single_row(b, torch.where(sel, st.tok, y), base_labels(sel, forced & sel))
        br.unmade = state["prefill"]          # counted once, with round 0's branches
        return br

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        state = {"prefill": torch.zeros_like(br.n)}
        ch = Choice(torch.zeros_like(br.n), br.labels, state=state)
        if self.rules.unmade_extra_calls:         # a live state still holds a mask
            row = br.rows[:, 0]
            done = ~(row == b.mask_id).any(-1)
            # the last block never holds prompt tokens (a region is at least two blocks)
            eos = (torch.isin(row, b.eos) & (b.blk == b.nb - 1)).any(-1) & b.early_stop
            ch.unmade = (done & ~eos).long()      # this round completes the region
        return ch
