"""The SwiGLU MLP: a block's dense MLP and a MoE layer's shared experts."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from . import ops
from .parallel import row_parallel


class MLP(nn.Module):
    """[N, T, d] -> [N, T, d]: SwiGLU of width ``hidden``, no biases; with ``comm``, this
    rank's span of a wider one, whose down projection is summed over the ranks."""

    def __init__(self, d_model: int, hidden: int, comm=None):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)
        self.comm = comm

    def forward(self, x):
        h = F.silu(ops.linear(x, self.gate_proj.weight)) * ops.linear(x, self.up_proj.weight)
        if self.comm is None:
            return ops.linear(h, self.down_proj.weight)
        return row_parallel(h, self.down_proj.weight, None, self.comm)
