"""The batch-invariant implementation of the network's numeric entry points (``models/ops.py``).

Every matrix product, attention and norm runs in a Triton kernel whose reduction order is fixed
by the problem's inner sizes only (K, the visible keys, the row width), never by the number of
rows, the padding or the other requests of the call: a request's logits are then bit-identical
whatever batch it is decoded in. Selected with ``ops.use(BatchInvariantOps())``; where the kernels
can run is ``support_error``'s to say (the package's ``__init__``).
"""

from __future__ import annotations

import torch

from .attention import attention as _attention
from .matmul import matmul
from .norm import rms_norm as _rms_norm

class BatchInvariantOps:
    """``linear``, ``attention``, ``rms_norm`` and ``grouped_linear`` with a fixed reduction
    order per row (see the module docstring); the same signatures as ``ops.TorchOps``."""

    name = "batch_invariant"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        x2 = x.reshape(-1, x.shape[-1])
        return matmul(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    def attention(self, q, k, v, bias, enable_gqa: bool):
        return _attention(q, k, v, bias, enable_gqa)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return _rms_norm(x, weight, eps)

    def grouped_linear(self, x: torch.Tensor, weight: torch.Tensor, group_sizes: list[int]):
        # each group's rows through the one fixed-order product: a row's result depends on its
        # own values and its group's weight only, never on the groups' sizes
        out = x.new_empty(x.shape[0], weight.shape[1])
        a = 0
        for w, n in zip(weight, group_sizes):
            if n:
                matmul(x[a:a + n], w, out=out[a:a + n])
            a += n
        return out


BATCH_INVARIANT = BatchInvariantOps()
