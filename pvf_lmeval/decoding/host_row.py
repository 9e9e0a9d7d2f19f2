"""The round's one host read, column by column: :class:`HostRow` names the columns once; the
device side builds the same tuple of [R] long tensors and stacks it (:func:`host_rows`), the
host reads it back (:meth:`HostRow.read`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class HostRow(NamedTuple):
    """One live request's row of a round's one host read (see the module docstring)."""

    #: the round's outcome (zeros for the initial call)
    stop: int                   # early-stop position, -1: none
    finished: int               # 1: the request is finished
    made_call: int              # 1: it made a call this round
    unmade: int                 # calls it counts without making them (rules=reference)
    unsettled: int              # 1: the round revoked a settled position (a decoder's bug)
    #: the next call's layout (``Runner.plan``)
    rows: int                   # rows the request sends (0: none)
    lo_block: int               # first and last active block of those rows (-1: none)
    hi_block: int
    full: int | None = None             # with a KV cache: 1 = a full call, 0 = a cached one
    cached_block: int | None = None     # the cached canvas's active block and reveal
    cached_reveal: int | None = None
    base_fits: int | None = None        # dual_base: the base row may refresh alone
    base_block: int | None = None       # ... its active block and reveal
    base_reveal: int | None = None

    @classmethod
    def read(cls, table: Tensor) -> list["HostRow"]:
        """The rows of ``table`` [R, C] (:func:`host_rows`), read to the host: one read."""
        return [cls(*row) for row in table.tolist()]


def host_rows(stop: Tensor, finished: Tensor, made_call: Tensor, unmade: Tensor,
              plan: dict, unsettled: Tensor | None = None) -> Tensor:
    """[R, C] long on the device: the :class:`HostRow` columns of the live requests (``plan``:
    ``Runner.plan``'s columns by name; ``unsettled`` None: zeros)."""
    if unsettled is None:
        unsettled = torch.zeros_like(unmade)
    cols = HostRow(stop, finished.long(), made_call.long(), unmade, unsettled.long(), **plan)
    return torch.stack([c for c in cols if c is not None], dim=-1)
