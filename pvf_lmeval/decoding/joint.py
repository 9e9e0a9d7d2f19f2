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

from .hooks import CallView, HookOut
from .param_spec import POSITIONS, Param
from .select import first_true, rank_desc
from .shared_params import THRESHOLD
from .stats import Stats
from .step import Branches, Choice, Step, base_labels, single_row


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


EDIT_THRESHOLD = Param("edit_threshold", float, None, "a decided token whose argmax "
                       "differs is rewritten when the argmax's probability is above it",
                       bounds="[0, 1]", none_means="0", exclusive=True)
EDITING = Param("editing", bool, None, "token-to-token edits (false: mask-to-token only)",
                none_means="true", exclusive=True)
POST_EDIT_STEPS = Param("post_edit_steps", int, None, "editing rounds after a block's "
                        "last mask", bounds=">= 0", cap=POSITIONS, none_means="16",
                        exclusive=True)
PENALTY = Param("penalty", float, None, "subtracted from the logit of the token at the "
                "previous position of the block", bounds=">= 0", finite=True, none_means="0",
                exclusive=True)


class JointDecoder(Step):
    name = "joint"
    summary = ("LLaDA2.1's joint threshold: masks above threshold, decided tokens rewritten "
               "above edit_threshold, editing rounds after a block fills")
    reads = (THRESHOLD, EDIT_THRESHOLD, EDITING, POST_EDIT_STEPS, PENALTY)
    defaults = {"threshold": 0.5}
    presets = {"llada21-quality": {"threshold": 0.7, "edit_threshold": 0.5},
               "llada21-speed": {"threshold": 0.5, "editing": False}}
    revocable = True
    #: cached calls treat a held block without masks as finished and read its keys and values
    #: from before its edits
    caches = ("none",)
    loop_switches = ("argmax_over_mask", "stop_after_block")

    def __init__(self, params):
        super().__init__(params)
        p = params
        self.edit = None if p.editing is False else (p.edit_threshold or 0.0)
        self.post_steps = 16 if p.post_edit_steps is None else p.post_edit_steps
        #: the reference's rounds per block at most (a block whose forced pick stays the mask)
        self.max_rounds = p.block_length + self.post_steps + 1
        self.penalty = p.penalty or 0.0
        if self.penalty > 0:
            self.call_hook = self._penalise
        self.unmade = self.rules.unmade_extra_calls

    def start(self, b) -> dict:
        y0 = b.initial()
        zero = torch.zeros(b.n, dtype=torch.long, device=b.device)
        return {"block": first_true(y0 == b.mask_id) // b.B, "post": zero, "rounds": zero,
                "fixed": y0 != b.mask_id}

    def open(self, b, rows: Tensor, state: dict | None = None) -> Tensor:
        """The masks of the held block and later ones (a block released with masks left, as
        the reference's round cap leaves it, keeps them)."""
        masked = rows == b.mask_id
        if state is None:
            return masked
        return masked & (b.blk >= state["block"].view(-1, *[1] * (rows.dim() - 1)))

    def settled(self, b, open: Tensor, state: dict | None = None) -> Tensor:
        if state is None:
            return super().settled(b, open, state)
        return state["block"] * b.B

    def _decide(self, b, y: Tensor, st: Stats, fixed: Tensor, block: Tensor, post: Tensor,
                rounds: Tensor):
        """One round's transfers on held blocks ``block`` [R] (``post``, ``rounds``: its editing
        rounds and rounds so far): (m2t, t2t, forced, post, changes)."""
        inb = b.blk == block[:, None]
        has = (inb & (y == b.mask_id) & ~fixed).any(-1)
        post = post + (~has).long()
        m2t, t2t, forced = joint_transfers(st.tok, st.conf, y, inb, fixed, b.mask_id,
                                           self.p.threshold, self.edit)
        over = (~has & (post > self.post_steps)) | (rounds >= self.max_rounds)
        m2t, t2t, forced = (x & ~over[:, None] for x in (m2t, t2t, forced))
        return m2t, t2t, forced, post, (m2t | t2t).any(-1)

    def branches(self, b, y: Tensor, st: Stats, state: dict, draws=()) -> Branches:
        fixed, block = state["fixed"], state["block"]
        now = self._decide(b, y, st, fixed, block, state["post"], state["rounds"])
        # a round that changes nothing releases the block; the next one starts from this call
        nxt = block + 1
        go = ~now[4] & (nxt < b.nb)
        zero = torch.zeros_like(block)
        then = self._decide(b, y, st, fixed, nxt, zero, zero)
        m2t, t2t, forced = (torch.where(go[:, None], x1, x0) for x0, x1 in zip(now[:3], then[:3]))
        # past the last block once it is released (its masks, if the round cap left any, stay)
        block = torch.where(go, nxt, torch.where(now[4], block, torch.full_like(block, b.nb)))
        post = torch.where(go, then[3], now[3])
        rounds = torch.where(go, zero, state["rounds"]) + 1
        hold = now[4] | go
        z = torch.where(m2t | t2t, st.tok, y)
        nstate = {"block": block, "post": post, "rounds": rounds, "fixed": fixed}
        open_ = self.open(b, z, nstate)
        br = single_row(b, z, base_labels(m2t, forced), open=open_, hold=hold,
                        settled=block * b.B)
        br.cover = block * b.B              # a held block's stats, also with nothing open
        if self.unmade:                     # the reference's first call of the next block
            br.unmade = go.long()
        br.memo = {"state": nstate, "hold": hold}
        return br

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        return Choice(torch.zeros_like(br.n), br.labels, state=br.memo["state"],
                      hold=br.memo["hold"])

    def _penalise(self, b, view: CallView) -> HookOut:
        """``penalty`` off the logit of the token at the previous position of the block (its
        first position has none; a call's columns start at a block's start)."""
        prev = torch.cat([view.tokens[:, :1], view.tokens[:, :-1]], 1)
        off = torch.where(view.inside & (view.gpos % b.B != 0), -self.penalty, 0.0)
        view.logits.scatter_add_(-1, prev.unsqueeze(-1), off.unsqueeze(-1).to(view.logits.dtype))
        return HookOut(view.logits)
