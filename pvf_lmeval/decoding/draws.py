"""A step's random draws (``Step.draw_plan``): declared as :class:`Draw` records, made by the loop
before the step, per request, from the request's own generator, in the declared order.

A draw never depends on logits, so drawing before the call keeps any reference's order: torch's
``multinomial(p, 1)`` is ``argmax(p / E)`` with ``E = empty_like(p).exponential_()`` drawn from
the same generator (checked bitwise), so a step samples from a distribution it does not know yet
by declaring the exponentials and reading them after the call (in its call hook, or in the next
round's branches). Kinds, each a float32 or long tensor of ``shape`` per request:

- ``uniform``: ``torch.rand(shape)``, [0, 1);
- ``exponential``: ``torch.empty(shape).exponential_()``, Exp(1);
- ``randint``: ``torch.randint(0, high, shape)``.

``when`` [R] bool (optional): only those requests draw (the others get zeros and their generator
does not move). Reading it is one more host read in the round that draws, so a step uses it
only where a reference's order depends on the state (a new canvas drawn only when the last one
ends); a plan without ``when`` costs no read.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

KINDS = ("uniform", "exponential", "randint")


class Draw(NamedTuple):
    """One draw of a plan: ``kind`` (one of :data:`KINDS`), ``shape`` per request, ``high`` (the
    exclusive bound of ``randint``), ``when`` ([R] bool or None: every live request draws)."""

    kind: str
    shape: tuple[int, ...]
    high: int | None = None
    when: Tensor | None = None


def draw_one(d: Draw, g: torch.Generator) -> Tensor:
    """One request's draw ``d`` from generator ``g`` (on the generator's device)."""
    if d.kind == "uniform":
        return torch.rand(d.shape, generator=g, device=g.device)
    if d.kind == "exponential":
        return torch.empty(d.shape, dtype=torch.float32, device=g.device).exponential_(generator=g)
    if d.kind == "randint":
        return torch.randint(0, d.high, d.shape, generator=g, device=g.device)
    raise ValueError(f"draw kind {d.kind!r} must be one of {', '.join(KINDS)}")


def draw_plan(plan: tuple[Draw, ...], ids: list[int], generator, device) -> tuple[Tensor, ...]:
    """The draws of ``plan`` for the live requests ``ids`` (their numbers; ``generator(i)``
    gives request i's generator): one tensor [R, *shape] per draw, in the plan's order, request
    by request (each request's generator draws its whole plan in order, so its values never
    depend on the other requests). One host read when some draw has a ``when``."""
    if not plan:
        return ()
    conds = [d.when for d in plan if d.when is not None]
    takes = torch.stack(conds).tolist() if conds else []            # the one read, if any
    flags, k = [], 0
    for d in plan:
        if d.when is None:
            flags.append([True] * len(ids))
        else:
            flags.append(takes[k])
            k += 1
    per: list[list[Tensor]] = [[] for _ in plan]
    for r, i in enumerate(ids):
        g = generator(i)
        for j, d in enumerate(plan):
            if flags[j][r]:
                per[j].append(draw_one(d, g))
            else:
                per[j].append(torch.zeros(d.shape, dtype=torch.long if d.kind == "randint"
                                          else torch.float32, device=g.device))
    return tuple(torch.stack(x).to(device) for x in per)
