"""RMS norm computed row by row, one program per row, in a fixed order.

The mean of squares of a row is the float32 sum of ``BLOCK`` wide chunks in order of the
columns, each chunk summed by the same tree: it depends on the row's width only, never on the
number of rows (a library reduction picks its split by the number of outputs as well).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: widest chunk of a row summed at once; wider rows are summed chunk after chunk
MAX_BLOCK = 8192


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, D, sx, sy, eps,
                     BLOCK: tl.constexpr, ONE_CHUNK: tl.constexpr, WEIGHT_FP32: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if ONE_CHUNK:
        x = tl.load(x_ptr + row * sx + cols, mask=cols < D, other=0.0).to(tl.float32)
        ss = tl.sum(x * x, axis=0)
    else:
        ss = tl.sum(tl.zeros((BLOCK,), dtype=tl.float32), axis=0)
        for c0 in range(0, D, BLOCK):
            c = c0 + cols
            x = tl.load(x_ptr + row * sx + c, mask=c < D, other=0.0).to(tl.float32)
            ss += tl.sum(x * x, axis=0)
    r = 1.0 / tl.sqrt(ss / D + eps)
    for c0 in range(0, D, BLOCK):
        c = c0 + cols
        x = tl.load(x_ptr + row * sx + c, mask=c < D, other=0.0)
        w = tl.load(w_ptr + c, mask=c < D, other=0.0)
        if WEIGHT_FP32:
            # flash-attn's fused rms_norm_fn: times the weight in float32, one rounding
            y = (x.to(tl.float32) * r * w.to(tl.float32)).to(y_ptr.dtype.element_ty)
        else:
            # Hugging Face's RMSNorm: normalise in float32, back to the working dtype, times
            # the weight (an exact float32 product of two values of that dtype, rounded once)
            xn = (x.to(tl.float32) * r).to(x.dtype)
            y = (w.to(tl.float32) * xn.to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + row * sy + c, y, mask=c < D)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             weight_fp32: bool = False) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x**2) + eps))`` over the last dim of ``x`` [..., D], the
    normalisation in float32, the result in ``x``'s dtype, the weight applied as
    ``TorchOps.rms_norm`` does (``weight_fp32``: in float32 before the one rounding)."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], D), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(triton.next_power_of_2(D), MAX_BLOCK)
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, y, D, x2.stride(0), y.stride(0), float(eps),
                                         BLOCK=block, ONE_CHUNK=block >= D,
                                         WEIGHT_FP32=bool(weight_fp32),
                                         num_warps=4 if block <= 2048 else 8)
    return y.view(x.shape)
