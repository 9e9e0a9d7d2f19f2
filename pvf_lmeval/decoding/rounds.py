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
from .step import NONE, Branches, Choice


@dataclass
class Settled:
    """A round's outcome for the live requests, after its call.

    y:        [R, L] the committed states; st: their stats.
    labels:   [R, L] int8 route codes of this round's commits.
    made:     [R] bool: the request made a call this round.
    routes:   [R, L] int8 route codes so far; tally: [R, 2] long (plan_tried, plan_passed) so far.
    stop:     [R] long early-stop position (-1: none); finished: [R] bool.
    choice:   the step's :class:`.step.Choice` (its ``state`` for the next round, what the loop
              records, its ``memo`` for the trace).
    """

    y: Tensor
    st: Stats
    labels: Tensor
    made: Tensor
    routes: Tensor
    tally: Tensor
    stop: Tensor
    finished: Tensor
    choice: Choice


def settle(b, step, y: Tensor, st: Stats, br: Branches, out: Stats, routes: Tensor,
           tally: Tensor) -> Settled:
    """The round's commit after its call ``out`` (stats [R, M, L] of the rows ``br`` sent), for
    the live requests with committed states ``y`` [R, L], their stats ``st`` and their route
    codes and tallies so far."""
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
    open = (y == b.mask_id) if ch.open is None else ch.open
    stop = b.stop_index(y, open)
    finished = (stop >= 0) | ~open.any(-1)
    return Settled(y, st, labels, made, routes, tally, stop, finished, ch)


def prepare(b, runner, step, y: Tensor, st: Stats, state: dict | None, draws: Tensor | None,
            stop: Tensor, finished: Tensor, made: Tensor) -> tuple[Branches, Tensor]:
    """The next round's branches of every live request (states ``y`` [R, L], stats ``st``, the
    step's ``state`` and ``draws``; the loop drops the branches of requests that finished), and
    the round's :class:`.host_row.HostRow` table [R, C] on the device: this round's ``stop``,
    ``finished`` and ``made`` call, the calls the next round counts without making them
    (``Branches.unmade``), and the next call's layout (``Runner.plan``)."""
    br = step.branches(b, y, st, state, draws)
    unmade = torch.zeros_like(br.n) if br.unmade is None else br.unmade
    return br, host_rows(stop, finished, made, unmade, runner.plan(br.rows, br.n, cover=br.cover))
