"""The numeric entry points of the native network: every matrix product, attention and norm.

The network (``transformer.py``, and any layer a model family adds, such as routed experts)
computes through these functions and nothing else for its reductions:

    linear(x, weight, bias=None)              x [..., K] @ weight[N, K].T (+ bias)  -> [..., N]
    attention(q, k, v, bias, enable_gqa,      q [B, H, Q, D], k/v [B, Hkv, T, D], additive
              scale=None)                     bias broadcastable to [B, H, Q, T] -> [B, H, Q, D];
                                              scores q.k times ``scale`` (None: 1/sqrt(D))
    rms_norm(x, weight, eps, weight_fp32)     normalised in float32, returned in x's dtype;
                                              the weight multiplied in x's dtype after the
                                              normalised x is rounded to it (Hugging Face's
                                              RMSNorm), or with ``weight_fp32`` in float32
                                              before the one rounding (flash-attn's fused
                                              ``rms_norm_fn``); the same in float32
    grouped_linear(x, weight, group_sizes)    rows of x [M, K] in consecutive groups, group g
                                              multiplied by weight[g] [N, K].T -> [M, N]
                                              (routed experts: one product per expert)
    activation(x, name)                       an MLP's gate activation (:data:`ACTIVATIONS`),
                                              elementwise
    rank_sum(x, comm)                         the sum over a tensor-parallel group's ranks of
                                              their partial results x, in float32
                                              (``parallel.Comm``)

so that the implementation behind them can be swapped as a whole: :class:`TorchOps` calls
torch's own kernels (the default); a batch-invariant implementation (fixed reduction order
whatever the number of rows) is selected per call with :func:`use`. Keeping the seam this
small lets a test or a kernel library replace every reduction of the model in one place.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


#: the gate activations of the gated MLPs: SwiGLU's silu, GeGLU's tanh-approximated GELU
#: (Gemma's ``gelu_pytorch_tanh``)
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class TorchOps:
    """torch's own kernels: fastest, but the reduction split of a matrix product (and the
    attention tiling over padded rows) may depend on the batch's shape, on the CPU as on CUDA
    (docs/batch-invariance.md)."""

    name = "torch"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        return F.linear(x, weight, bias)

    def attention(self, q, k, v, bias, enable_gqa: bool, scale: float | None = None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=False,
                                              enable_gqa=enable_gqa, scale=scale)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_fp32: bool = False) -> torch.Tensor:
        # Normalise in float32 as the reference models do, then return to the working dtype:
        # rounded before the weight (two roundings below float32) or after it (one).
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if weight_fp32:
            return (xf * weight.float()).to(x.dtype)
        return weight * xf.to(x.dtype)

    def grouped_linear(self, x: torch.Tensor, weight: torch.Tensor, group_sizes: list[int]):
        outs = [F.linear(part, w) for part, w in zip(x.split(group_sizes), weight) if part.numel()]
        return torch.cat(outs) if outs else x.new_zeros(0, weight.shape[1])

    def activation(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return ACTIVATIONS[name](x)

    def rank_sum(self, x: torch.Tensor, comm) -> torch.Tensor:
        # the backend's all-reduce: its order of summation may follow the message size
        return comm.all_reduce(x.float())


TORCH = TorchOps()
_active = TORCH


def active():
    """The implementation the network computes with right now."""
    return _active


@contextlib.contextmanager
def use(impl):
    """Compute with ``impl`` (an object with the four methods) inside the ``with`` block."""
    global _active
    previous, _active = _active, impl
    try:
        yield impl
    finally:
        _active = previous


def linear(x, weight, bias=None):
    return _active.linear(x, weight, bias)


def attention(q, k, v, bias, enable_gqa: bool = False, scale: float | None = None):
    return _active.attention(q, k, v, bias, enable_gqa, scale)


def rms_norm(x, weight, eps: float, weight_fp32: bool = False):
    return _active.rms_norm(x, weight, eps, weight_fp32)


def grouped_linear(x, weight, group_sizes):
    return _active.grouped_linear(x, weight, group_sizes)


def activation(x, name: str):
    return _active.activation(x, name)


def rank_sum(x, comm):
    return _active.rank_sum(x, comm)
