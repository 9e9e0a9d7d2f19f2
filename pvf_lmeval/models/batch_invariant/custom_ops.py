"""The batch-invariant implementation of the network's numeric entry points (``models/ops.py``).

Every matrix product, attention and norm runs in a Triton kernel whose reduction order is fixed
by the problem's inner sizes only (K, the visible keys, the row width), never by the number of
rows, the padding or the other requests of the call: a request's logits are then bit-identical
whatever batch it is decoded in. Selected with ``ops.use(BatchInvariantOps())``; where the kernels
can run is ``support_error``'s to say (the package's ``__init__``).

The kernels are registered as torch custom ops (``pvf_bi::...``): ``torch.compile`` then keeps
each one as an opaque call in its graph instead of tracing into the launch code, so a compiled
model computes with exactly the kernels an eager one does.
"""

from __future__ import annotations

import torch

from . import attention as _attention_mod
from . import matmul as _matmul_mod
from . import norm as _norm_mod

@torch.library.custom_op("pvf_bi::matmul", mutates_args=())
def _matmul_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _matmul_mod.matmul(x, weight, bias)


@_matmul_op.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("pvf_bi::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                  enable_gqa: bool, scale: float | None = None) -> torch.Tensor:
    return _attention_mod.attention(q, k, v, bias, enable_gqa, scale)


@_attention_op.register_fake
def _(q, k, v, bias, enable_gqa, scale=None):
    return torch.empty_like(q)


@torch.library.custom_op("pvf_bi::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_fp32: bool) -> torch.Tensor:
    return _norm_mod.rms_norm(x, weight, eps, weight_fp32)


@_rms_norm_op.register_fake
def _(x, weight, eps, weight_fp32):
    return torch.empty_like(x)


class BatchInvariantOps:
    """``linear``, ``attention``, ``rms_norm`` and ``grouped_linear`` with a fixed reduction
    order per row (see the module docstring); the same signatures as ``ops.TorchOps``."""

    name = "batch_invariant"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        x2 = x.reshape(-1, x.shape[-1])
        return _matmul_op(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    def attention(self, q, k, v, bias, enable_gqa: bool, scale: float | None = None):
        return _attention_op(q, k, v, bias, bool(enable_gqa), scale)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_fp32: bool = False) -> torch.Tensor:
        return _rms_norm_op(x, weight, float(eps), bool(weight_fp32))

    def grouped_linear(self, x: torch.Tensor, weight: torch.Tensor, group_sizes: list[int]):
        # each group's rows through the one fixed-order product: a row's result depends on its
        # own values and its group's weight only, never on the groups' sizes
        outs = [_matmul_op(part, w, None) for part, w in zip(x.split(group_sizes), weight)
                if part.numel()]
        return torch.cat(outs) if outs else x.new_zeros(0, weight.shape[1])

    def activation(self, x: torch.Tensor, name: str) -> torch.Tensor:
        # a CUDA elementwise kernel computes every element with the same instructions
        from ..ops import ACTIVATIONS

        return ACTIVATIONS[name](x)

    def rank_sum(self, x: torch.Tensor, comm) -> torch.Tensor:
        # tensor parallel: the partials gathered and added in rank order, never an all-reduce
        # whose order may follow the message size
        return comm.ordered_sum(x.float())


BATCH_INVARIANT = BatchInvariantOps()
