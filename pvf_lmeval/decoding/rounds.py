"""The tensor work of one decode round around its model call (docs/decoding.md, "Shared loop").

A round of :func:`.loop.run` is: call, settle, commit, prepare, read, retire. This module holds
its two tensor steps: :func:`settle` (the step's choice, the commit, early stop) after the call,
and :func:`prepare` (the next round's branches, their call layout, and the row the host reads)
after the KV-cache commit. Both are functions of tensors and plain values: no host read, no
upload, no side effect, no Python value that changes from round to round (the live requests
travel as ``Batch.req``, on the device; the step's draws and state come in as tensors). So each
can run as one compiled program (``compile_round``, :func:`.compiled.round_programs`) without a
graph break, and the same code runs eager.

The live requests are the batch's (``Batch.req``, ``Batch.ids``), not an argument: a host list
given to a compiled program becomes a guard on its length and values, a new program for every
set of live requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .host_row import host_rows
from .stats import Stats
from .step import EDIT, NONE, Branches, Choice


#: the columns of a request's tally (``Live.tally``, ``Settled.tally``), in order
TALLY = ("plan_tried", "plan_passed", "edits", "remasks")


@dataclass
class Settled:
    """A round's outcome for the live requests, after its call.

    y:        [R, L] the committed states; st: their stats.
    labels:   [R, L] int8 route codes of this round's commits.
    made:     [R] bool: the request made a call this round.
    pick:     [R] long: the row each request committed (0 where it made no call).
    routes:   [R, L] int8 route codes so far; tally: [R, 4] long (:data:`TALLY`) so far.
    stop:     [R] long early-stop position (-1: none); finished: [R] bool.
    unmade:   [R] long: calls of this round counted without being made (``Choice.unmade``).
    unsettled: [R] bool: the round remasked or edited a position that was settled before it
              (outside the working blocks of a revocable step: the loop raises).
    choice:   the step's :class:`.step.Choice` (its ``state`` for the next round, what the loop
              records, its ``memo`` for the trace).
    """

    y: Tensor
    st: Stats
    labels: Tensor
    made: Tensor
    pick: Tensor
    routes: Tensor
    tally: Tensor
    stop: Tensor
    finished: Tensor
    unmade: Tensor
    unsettled: Tensor
    choice: Choice


def settle(b, step, y: Tensor, st: Stats, state: dict | None, br: Branches, out: Stats,
           routes: Tensor, tally: Tensor) -> Settled:
    """The round's commit after its call ``out`` (stats [R, M, L] of the rows ``br`` sent), for
    the live requests with committed states ``y`` [R, L], their stats ``st``, the step's
    ``state`` and their route codes and tallies so far.

    Revocable commits are counted here, once for every decoder, from the state before and after
    the round (docs/decoding.md, "Revocable commits"): a decided position that is open again is
    a *remask* (its route is cleared), a decided position that holds another token an *edit*
    (route ``edit`` for a revocable step; ``rules=reference``'s pvf rewrites its base set after
    a failed plan: counted, the route kept). A request is finished when its early-stop rule fires (settled positions
    only, ``Step.settled``), or when nothing is open and it holds no block (``Choice.hold``)."""
    ch = step.choose(b, y, st, br, out)
    made = br.n > 0
    pick = torch.where(made, ch.pick, torch.zeros_like(ch.pick))
    y_new = br.rows[torch.arange(pick.shape[0], device=pick.device), pick]
    if ch.remask is not None:           # rules=reference only
        y_new = torch.where(ch.remask & made[:, None], torch.full_like(y_new, b.mask_id), y_new)
    if ch.extra is not None:
        y_new = torch.where(ch.extra & made[:, None], st.tok, y_new)
    labels = torch.where(made[:, None], ch.labels, br.labels)
    st = out.pick(pick)
    was, now = step.open(b, y, state), step.open(b, y_new, ch.state)
    remask = ~was & now
    edit = ~was & ~now & (y != y_new)
    routes = torch.where(labels != NONE, labels, routes)
    routes = torch.where(remask, torch.zeros_like(routes), routes)
    if step.revocable:      # pvf's rules=reference rewrite of its base set keeps its route
        routes = torch.where(edit, torch.full_like(routes, EDIT), routes)
    zero = torch.zeros_like(pick)
    # revocations only where nothing was settled (a revocable step's working blocks); pvf's
    # rules=reference rewrite of its base set is in its active block, before its first mask
    frontier = step.settled(b, was, state) if step.revocable else zero
    unsettled = ((remask | edit) & (b.idx < frontier[:, None])).any(-1)
    counts = [ch.tally.get("plan_tried", zero), ch.tally.get("plan_passed", zero),
              edit.sum(-1), remask.sum(-1)]
    tally = tally + torch.stack(counts, -1)
    stop = b.stop_index(y_new, now, step.settled(b, now, ch.state))
    done = ~now.any(-1)
    if ch.hold is not None:
        done &= ~ch.hold
    finished = (stop >= 0) | done
    unmade = zero if ch.unmade is None else ch.unmade
    return Settled(y_new, st, labels, made, pick, routes, tally, stop, finished, unmade,
                   unsettled, ch)


def prepare(b, runner, step, y: Tensor, st: Stats, state: dict | None, draws: tuple,
            stop: Tensor, finished: Tensor, made: Tensor, unmade: Tensor | None = None,
            unsettled: Tensor | None = None) -> tuple[Branches, Tensor]:
    """The next round's branches of every live request (states ``y`` [R, L], stats ``st``, the
    step's ``state`` and ``draws``; the loop drops the branches of requests that finished), and
    the round's :class:`.host_row.HostRow` table [R, C] on the device: this round's ``stop``,
    ``finished`` and ``made`` call, the calls counted without being made (this round's
    ``unmade`` [R], every request's, and the next round's ``Branches.unmade``, the requests'
    that stay live), whether it revoked a settled position (``unsettled``), and the next call's
    layout (``Runner.plan``)."""
    br = step.branches(b, y, st, state, draws)
    later = torch.zeros_like(br.n) if br.unmade is None else br.unmade
    count = torch.where(finished, torch.zeros_like(later), later)
    if unmade is not None:
        count = count + unmade
    return br, host_rows(stop, finished, made, count,
                         runner.plan(br.rows, br.n, cover=br.cover, open=br.open), unsettled)
