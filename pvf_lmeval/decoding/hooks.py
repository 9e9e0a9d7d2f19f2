"""A step's call hook and its carry: per-call work on the logits themselves, and state a call
produces for the next call (docs/design.md, "Seams of the loop").

The statistics pass reduces every call to a few numbers per position (:class:`.stats.Stats`);
nothing V-wide outlives a call. A step that needs more declares ``Step.call_hook``: the runner
calls it on every physical call, between the model and the statistics pass, with a
:class:`CallView` (the logits and what the rows hold there), and the hook returns a
:class:`HookOut`: the logits the statistics pass reads, a *carry* for the next call, and named
per-position values for ``Stats.extra``. Examples: dInfer's credit (a matrix [V] per position,
decayed and accumulated call after call, added to the logits), DiffusionGemma's
self-conditioning (the previous denoising step's processed logits; passing them to the next
call as a model input is that decoder's addition to the protocol), a sample drawn with the
round's exponentials.

The carry is the runner's, as the KV caches are (:class:`Carry`): one value per request and
generation position, written by a call's rows and kept for the row the request commits
(``Runner.commit_carry`` after the round's choice), read by the request's next call at the
positions it covers. Where no committed call wrote a position yet, the view holds zeros and
``carried`` is False there. A carry that must restart (at a block change) is the hook's to
reset: ``CallView.block`` says which block each row works on.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class CallView(NamedTuple):
    """One physical model call as a step's call hook sees it: N rows (several per request for a
    multi-row step), P generation positions per row (a row's columns past its own range repeat
    its last position; ``inside`` False there).

    logits:  [N, P, V] float32, the model's; the hook may change them in place.
    tokens:  [N, P] long, the tokens the rows hold at those positions.
    gpos:    [N, P] long, the generation position (0..L-1) of each column.
    inside:  [N, P] bool, the column is in the row's requested range.
    open:    [N, P] bool, the row's open positions there (``Step.open``).
    block:   [N] long, each row's active block (its held block, else the block of its first
             open position; ``nb``: none).
    carry:   [N, P, C] the carry the row's request committed at those positions (zeros where
             none was written), None while the batch has none at all.
    carried: [N, P] bool, positions of ``carry`` a committed call wrote.
    draws:   the round's draws (``Step.draw_plan``), each [N, ...]: the row's request's.
    args:    ``Branches.hook``'s values, each [N, ...]: the row's request's.
    """

    logits: Tensor
    tokens: Tensor
    gpos: Tensor
    inside: Tensor
    open: Tensor
    block: Tensor
    carry: Tensor | None
    carried: Tensor
    draws: tuple
    args: dict


class HookOut(NamedTuple):
    """What a call hook returns: ``logits`` [N, P, V] (float32) for the statistics pass (the
    view's, changed or not, or new ones); ``carry`` [N, P, C] (any dtype, any C; None: the call
    leaves no carry) kept for the committed row at the columns ``inside``; ``extra`` {name:
    [N, P]} per-position values, in ``Stats.extra`` at the rows' positions (0 outside the
    call)."""

    logits: Tensor
    carry: Tensor | None = None
    extra: dict | None = None


class Carry:
    """The carry of ``n`` requests over ``L`` generation positions (see the module docstring).

    ``value`` [n, L + 1, C] (allocated at the first carry a hook returns, in its dtype and
    width; position L is a spare slot that absorbs the writes of columns outside a row's range)
    and ``carried`` [n, L + 1] bool. A call's carries wait in ``pending`` until :meth:`commit`
    keeps the committed row's."""

    def __init__(self, n: int, L: int, device):
        self.n, self.L = n, L
        self.value: Tensor | None = None
        self.carried = torch.zeros((n, L + 1), dtype=torch.bool, device=device)
        self._pending: list[tuple[Tensor, ...]] = []

    def view(self, req: Tensor, gpos: Tensor) -> tuple[Tensor | None, Tensor]:
        """(carry [N, P, C] or None, carried [N, P]) of requests ``req`` [N] at ``gpos`` [N, P]."""
        r = req[:, None].expand_as(gpos)
        carried = self.carried[r, gpos]
        return (None if self.value is None else self.value[r, gpos]), carried

    def keep(self, r: Tensor, j: Tensor, req: Tensor, gpos: Tensor, inside: Tensor,
             out: Tensor) -> None:
        """A call's carry ``out`` [N, P, C] of rows ``j`` [N] of live requests ``r`` [N]
        (numbers ``req`` [N]), at ``gpos`` where ``inside``: kept until :meth:`commit`."""
        if self.value is None:
            self.value = out.new_zeros((self.n, self.L + 1, out.shape[-1]))
        self._pending.append((r, j, req, gpos, inside, out))

    def commit(self, pick: Tensor, made: Tensor) -> None:
        """After a round's choice: for each live request r that ``made`` a call, the carry of its
        committed row ``pick[r]`` replaces its values at the positions that row's call covered
        (one set of tensor operations; other rows' carries are dropped)."""
        for r, j, req, gpos, inside, out in self._pending:
            kept = (j == pick[r]) & made[r]                                          # [N]
            at = torch.where(kept[:, None] & inside, gpos, torch.full_like(gpos, self.L))
            rq = req[:, None].expand_as(gpos)
            self.value.index_put_((rq, at), out.to(self.value.dtype))
            self.carried.index_put_((rq, at), torch.ones_like(at, dtype=torch.bool))
        self._pending = []
