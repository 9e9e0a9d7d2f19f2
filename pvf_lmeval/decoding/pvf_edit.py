"""``pvf-edit``: Plan-Verify-Fill with LLaDA2.1's token-to-token editing (docs/decoding.md
"PVF with editing").

A request holds one block at a time, the active block. Each round is PVF's step (:mod:`.pvf`:
base set, planning branches verified in the batched call, else AR fills) on the held block's
masks (and, with ``reveal_next``, the next block's), and its base row z_base, so every branch
row of the call, also rewrites each token decided earlier in the held block (by any route; not
a token the block held when it was entered, a prompt's tail) whose argmax under the current
state's stats differs from it with a probability above ``edit_threshold`` (strict, as joint's
:func:`.joint.joint_transfers`). Those stats are the call's on the row PVF committed last round,
so edits cost no call of their own. After the held block's last mask, editing rounds go on, at
most ``post_edit_steps``; the first round that would change nothing in it releases it, and the
next block's round is made from the same call. ``editing=false`` is exactly ``pvf``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from .joint import EDIT_THRESHOLD, EDITING, POST_EDIT_STEPS
from .param_spec import Rule
from .pvf import PVFDecoder
from .select import first_true
from .stats import Stats
from .step import Branches, Choice


def held_blocks(y: Tensor, tok: Tensor, conf: Tensor, fixed: Tensor, block: Tensor,
                post: Tensor, mask_id: int, B: int, edit_threshold: float | None,
                post_steps: int) -> tuple[Tensor, Tensor, Tensor]:
    """(block, post, edits) of one round on states ``y`` [R, L] (``L`` a multiple of ``B``)
    that held ``block`` [R] with ``post`` [R] editing rounds after its last mask so far, from
    the argmax ``tok`` and its probability ``conf`` [R, L]:

    - a block is *done* when it has no mask and either none of its tokens (not ``fixed``) has
      an argmax that differs with ``conf > edit_threshold`` (strict; ``None``: editing off,
      never), or this round would be editing round ``post_steps + 1`` after its last mask;
    - the round holds the first block from ``block`` on that is not done (``R``-wide; ``nb``,
      the number of blocks, when every one is), with its editing rounds (this one counted when
      it has no mask), and rewrites the tokens of that block the rule above names.
    """
    R, L = y.shape
    nb = L // B
    masked = y == mask_id
    if edit_threshold is None:
        edits = torch.zeros_like(masked)
    else:
        edits = ~masked & ~fixed & (tok != y) & (conf > edit_threshold)
    k = torch.arange(nb, device=y.device)
    full = ~masked.view(R, nb, B).any(-1)                                       # [R, nb]
    rounds = torch.where(k == block[:, None], post[:, None] + 1, 1)              # [R, nb]
    done = full & (~edits.view(R, nb, B).any(-1) | (rounds > post_steps))
    held = first_true(~done & (k >= block[:, None]))
    held_full = full.gather(1, held.clamp(max=nb - 1)[:, None]).squeeze(1) & (held < nb)
    post = torch.where(held == block, post, torch.zeros_like(post)) + held_full.long()
    at = torch.arange(L, device=y.device) // B
    return held, post, edits & (at == held[:, None])


def _paper_rules_only(p) -> str | None:
    if p.rules == "paper":
        return None
    return (f"rules={p.rules}: decoder=pvf-edit has no published code to follow; "
            "it decodes with rules=paper")


class PVFEditDecoder(PVFDecoder):
    name = "pvf-edit"
    summary = ("Plan-Verify-Fill whose decided tokens stay editable: LLaDA2.1's edits above "
               "edit_threshold in the active block, editing rounds after it fills")
    reads = PVFDecoder.reads + (EDIT_THRESHOLD, EDITING, POST_EDIT_STEPS)
    checks = PVFDecoder.checks + (Rule(_paper_rules_only, "rules", "pvf-edit: paper"),)
    #: a cached call treats a held block without masks as finished and would read its keys
    #: and values from before its edits (as joint's)
    caches = ("none",)

    def __init__(self, params):
        super().__init__(params)
        p = params
        self.edit = None if p.editing is False else (p.edit_threshold or 0.0)
        self.post_steps = 16 if p.post_edit_steps is None else p.post_edit_steps
        # editing off: pvf's commits, which are final (early stop reads the first mask)
        self.revocable = self.edit is not None

    def start(self, b) -> dict:
        y0 = b.initial()
        return {"block": first_true(y0 == b.mask_id) // b.B,
                "post": torch.zeros(b.n, dtype=torch.long, device=b.device),
                "fixed": y0 != b.mask_id}

    def settled(self, b, open: Tensor, state: dict | None = None) -> Tensor:
        if state is None or not self.revocable:
            return super().settled(b, open, state)
        return state["block"] * b.B

    def branches(self, b, y: Tensor, st: Stats, state: dict, draws=None) -> Branches:
        block, post, edits = held_blocks(y, st.tok, st.conf, state["fixed"], state["block"],
                                         state["post"], b.mask_id, b.B, self.edit,
                                         self.post_steps)
        base, _ = self.base_round(b, y, st, b.working_set(y, self.reveal, active=block))
        zb = torch.where(edits, st.tok, base.zb)
        nstate = {"block": block, "post": post, "fixed": state["fixed"]}
        hold = block < b.nb if self.revocable else None
        settled = self.settled(b, zb == b.mask_id, nstate)
        base = replace(base, zb=zb, finished=b.finished(zb, hold=hold, settled=settled))
        br = self.route_rows(b, st, base, *self.route_sizes(b, st, base))
        if self.revocable:          # a held block's stats, also with nothing masked in it
            br.cover = block * b.B
        br.memo.update(state=nstate, hold=hold, edits=edits)
        return br

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        return replace(super().choose(b, y, st, br, out), state=br.memo["state"],
                       hold=br.memo["hold"])

    def info(self, r: int, made_call: bool, br: Branches, choice: Choice) -> dict:
        return {**super().info(r, made_call, br, choice),
                "block": int(br.memo["state"]["block"][r]),
                "edited": br.memo["edits"][r].nonzero().flatten().tolist()}
