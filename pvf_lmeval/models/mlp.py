"""The gated MLP: a block's dense MLP, a MoE layer's shared experts, DiffusionGemma's
self-conditioning input.

``act(gate(x)) * up(x)`` through ``down``: SwiGLU with ``act="silu"`` (LLaMA, Qwen, ...), GeGLU
with ``act="gelu_tanh"`` (Gemma's ``gelu_pytorch_tanh``: GELU's tanh approximation)."""

from __future__ import annotations

from torch import nn

from . import ops
from .ops import ACTIVATIONS  # noqa: F401  the names the configs' ``activation`` accepts
from .parallel import row_parallel


class MLP(nn.Module):
    """[N, T, d] -> [N, T, d]: a gated MLP of width ``hidden``, no biases; with ``comm``, this
    rank's span of a wider one, whose down projection is summed over the ranks."""

    def __init__(self, d_model: int, hidden: int, comm=None, act: str = "silu"):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)
        self.comm = comm
        if act not in ACTIVATIONS:
            raise ValueError(f"act={act!r} must be one of {', '.join(ACTIVATIONS)}")
        self.act = act

    def forward(self, x):
        h = (ops.activation(ops.linear(x, self.gate_proj.weight), self.act)
             * ops.linear(x, self.up_proj.weight))
        if self.comm is None:
            return ops.linear(h, self.down_proj.weight)
        return row_parallel(h, self.down_proj.weight, None, self.comm)
