"""The tensor work of one decode round around its model call (SPEC "Shared loop").

A round of :func:`.loop.run` is: the model call, :func:`settle` (the step's choice, the commit,
early stop), the KV-cache commit (data work over the layers' keys and values, with host-side
bookkeeping), then :func:`prepare` (the next round's branches and call layout, and the row the
host reads). ``settle`` and ``prepare`` are tensor operations only: no host read, no upload, no
Python value that changes from round to round (the live requests travel as ``Batch.req``, on the
device). So each can run as one compiled program (``compile_round``,
:func:`.compiled.round_programs`) without a graph break, and the same code runs eager.

The live requests are the batch's (``Batch.req``, ``Batch.ids``), not an argument: a host list
given to a compiled program becomes a guard on its length and values, a new program for every
set of live requests.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import NONE, Branches


def settle(b, step, y: Tensor, st, br: Branches, out, routes: Tensor, tally: Tensor):
    """The round's commit after its call ``out`` (stats [R, M, L] of the rows ``br`` sent), for
    the live requests with committed states ``y`` [R, L] and their stats ``st``.

    Returns (y, st, labels, made, routes, tally, e, finished, choice): the newly committed
    states [R, L] and their stats; the round's route codes [R, L] (int8); whether each request
    made a call [R]; the route codes [R, L] and tallies [R, 2] (plan_tried, plan_passed) so far;
    the early-stop position e [R] (-1: none); whether each request is finished [R]; the step's
    :class:`.common.Choice` (its ``memo`` feeds the trace)."""
    ch = step.choose(b, y, st, br, out)
    made = br.n > 0
    pick = torch.where(made, ch.pick, torch.zeros_like(ch.pick))
    y = br.rows[torch.arange(pick.shape[0], device=pick.device), pick]
    if ch.remask is not None:           # rules=reference only
        y = torch.where(ch.remask & made[:, None], torch.full_like(y, b.mask_id), y)
    if ch.extra is not None:
        y = torch.where(ch.extra & made[:, None], st.tok, y)
    labels = torch.where(made[:, None], ch.labels, br.labels)
    st = out.pick(pick)
    routes = torch.where(labels != NONE, labels, routes)
    if ch.tally:
        tally = tally + torch.stack([ch.tally["plan_tried"], ch.tally["plan_passed"]], -1)
    e = b.stop_index(y)
    finished = (e >= 0) | ~(y == b.mask_id).any(-1)
    return y, st, labels, made, routes, tally, e, finished, ch


def prepare(b, step, y: Tensor, st, e: Tensor, finished: Tensor,
            made: Tensor) -> tuple[Branches, Tensor]:
    """After the cache commit: the next round's branches of every live request (the loop drops
    those of requests that finished) and what the host reads of the round, [R, 4 + C] long on
    the device: e, finished, made a call, then :func:`next_round`'s columns."""
    nbr, nxt = next_round(b, step, y, st)
    return nbr, torch.cat([torch.stack([e, finished.long(), made.long()], -1), nxt], -1)


def next_round(b, step, y: Tensor, st) -> tuple[Branches, Tensor]:
    """The next round's branches of the live requests (states ``y`` [R, L], stats ``st``) and
    what the host needs of them, [R, 1 + C] long on the device: the calls each request counts
    without making them (``Branches.unmade``), then ``Batch.plan``'s layout."""
    br = step.branches(b, y, st)
    unmade = torch.zeros_like(br.n) if br.unmade is None else br.unmade
    return br, torch.cat([unmade[:, None], b.plan(br.rows, br.n, cover=br.cover)], -1)
