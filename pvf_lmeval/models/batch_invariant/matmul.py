"""Matrix products whose every output row is computed the same way whatever the number of rows.

``matmul(x [M, K], weight [N, K], bias)`` = ``x @ weight.T (+ bias)`` with one fixed tile shape
per dtype: every output element is the float32 sum of its ``BLOCK_K``-wide partial dot products
taken in order of k, one tile of K after the other, in one program. No split of K across
programs, no choice of kernel or tiling by the number of rows: row m's result depends only on
row m of ``x`` and on ``weight`` (tensor-core dot products compute each element of a tile alike,
whatever the tile's other rows hold). Library matrix products (cuBLAS) pick their kernel and
split-K by the shape, so a row's bits move with the batch it sits in.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: tile shapes per input dtype (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages); fixed, never chosen
#: by the problem's size, so that the reduction order (BLOCK_K steps) is a constant.
CONFIGS = {
    torch.bfloat16: (128, 128, 64, 8, 3),
    torch.float16: (128, 128, 64, 8, 3),
    torch.float32: (64, 64, 32, 4, 3),
}
GROUP_M = 8


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, b_ptr, c_ptr, M, N, K,
                   sxm, sxk, swn, swk, scm, scn,
                   HAS_BIAS: tl.constexpr, INTERP: tl.constexpr, IEEE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP: tl.constexpr):
    # grouped tile order (L2 reuse of weight tiles); the order tiles run in changes no value
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BLOCK_M)
    n_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP * n_n
    first_m = (pid // per_group) * GROUP
    size_m = tl.minimum(n_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = tl.arange(0, BLOCK_K)
    om64 = om.to(tl.int64)
    on64 = on.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ok
        a = tl.load(x_ptr + om64[:, None] * sxm + kk[None, :] * sxk,
                    mask=(om[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + on64[None, :] * swn + kk[:, None] * swk,
                    mask=(on[None, :] < N) & (kk[:, None] < K), other=0.0)
        if INTERP:
            # Triton's interpreter: its dot is numpy's matmul (BLAS, whose sums may depend on a
            # row's place in the tile, and which multiplies bfloat16 as integers); a product
            # tensor summed over k models the per-element dot of the GPU's tensor cores
            prod = a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]
            acc += tl.sum(prod, axis=1)
        elif IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + on, mask=on < N, other=0.0).to(tl.float32)[None, :]
    tl.store(c_ptr + om64[:, None] * scm + on64[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(om[:, None] < M) & (on[None, :] < N))


def interpreting() -> bool:
    """Whether Triton's CPU interpreter runs these kernels (``TRITON_INTERPRET=1`` when they
    were defined: tests)."""
    return type(_matmul_kernel).__name__ == "InterpretedFunction"


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``x`` [M, K] @ ``weight`` [N, K].T (+ ``bias`` [N]) -> [M, N] in ``x``'s dtype, float32
    accumulation in a fixed order (module docstring)."""
    M, K = x.shape
    N = weight.shape[0]
    if weight.shape[1] != K or weight.dtype != x.dtype:
        raise ValueError(f"matmul: x {tuple(x.shape)} {x.dtype} and weight "
                         f"{tuple(weight.shape)} {weight.dtype} do not match")
    bm, bn, bk, warps, stages = CONFIGS[x.dtype]
    c = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return c
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _matmul_kernel[grid](
        x, weight, bias if bias is not None else x, c, M, N, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), c.stride(0), c.stride(1),
        HAS_BIAS=bias is not None, INTERP=interpreting(), IEEE=x.dtype == torch.float32,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=GROUP_M, num_warps=warps, num_stages=stages)
    return c
