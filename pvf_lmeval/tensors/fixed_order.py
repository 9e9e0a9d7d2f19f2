"""Sums in one fixed order, shared by the network (``models/batch_invariant/cpu.py``) and the
decoding side (``decoding/stats.py``, ``decoding/batch.py``): a row's sum depends on its own
values only."""

from __future__ import annotations

import torch
from torch import Tensor


def fixed_sum(x: Tensor) -> Tensor:
    """Sum over the last dim of ``x`` [..., n] -> [...] in one fixed pairwise order: halve the
    row by elementwise adds of its two halves (an odd last column carried along) until one
    column is left. Every step is elementwise, so a row's sum depends on its own values only:
    never on the number of rows, the device's reduction kernels or their thread count (a library
    reduction splits a row by the number of rows it reduces)."""
    if x.shape[-1] == 0:
        return x.new_zeros(x.shape[:-1])
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        head = x[..., :h] + x[..., h:2 * h]
        x = torch.cat([head, x[..., 2 * h:]], -1) if x.shape[-1] % 2 else head
    return x[..., 0]
