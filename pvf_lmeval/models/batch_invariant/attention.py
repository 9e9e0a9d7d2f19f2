"""Attention whose every query row is computed the same way whatever the batch around it.

A row's attention over left-padded keys shifts with the padding: the key tiles of a library
kernel start at key 0, so the same real keys fall into other tiles (other partial sums) when the
batch's widest prompt changes. Here each query reads its *visible* keys only, packed: the keys
the additive ``bias`` leaves visible (0) are gathered in order, and the online softmax runs over
tiles of ``BLOCK_N`` of them from the first visible key on. Hidden keys (the bias at its dtype's
minimum: padding, another branch's fresh keys, a recomputed span) take no place in any tile, so
a query's result depends on its own visible keys only, never on how many hidden ones surround
them, nor on the other rows of the call.

Two kernels, chosen by the shape of the mask (a property of the call, not of the batch size):
queries that share one key set (``bias`` [B, 1, 1, T]: full calls) are computed in tiles of
``BLOCK_M`` queries with tensor-core dot products; queries with a key set each (``bias``
[B, 1, Q, T]: the cached calls' block-diagonal masks) one program per query.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .matmul import interpreting

BLOCK_M, BLOCK_N = 64, 64


@triton.jit
def _shared_keys_kernel(q_ptr, k_ptr, v_ptr, o_ptr, idx_ptr, cnt_ptr,
                        H, G, Q, D, scale,
                        sqb, sqh, sqq, sqd, skb, skh, skt, skd, svb, svh, svt, svd,
                        sob, soh, soq, sod, sib, scb,
                        INTERP: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    pid_q = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // G).to(tl.int64)
    oq = pid_q * BLOCK_M + tl.arange(0, BLOCK_M)
    od = tl.arange(0, BLOCK_D)
    qm = (oq[:, None] < Q) & (od[None, :] < D)
    q = tl.load(q_ptr + b * sqb + h * sqh + oq[:, None] * sqq + od[None, :] * sqd, mask=qm,
                other=0.0)
    n = tl.load(cnt_ptr + b * scb)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for j0 in range(0, n, BLOCK_N):
        jj = j0 + tl.arange(0, BLOCK_N)
        jm = jj < n
        key = tl.load(idx_ptr + b * sib + jj, mask=jm, other=0).to(tl.int64)
        kt = tl.load(k_ptr + b * skb + hk * skh + key[None, :] * skt + od[:, None] * skd,
                     mask=jm[None, :] & (od[:, None] < D), other=0.0)
        vt = tl.load(v_ptr + b * svb + hk * svh + key[:, None] * svt + od[None, :] * svd,
                     mask=jm[:, None] & (od[None, :] < D), other=0.0)
        if INTERP:      # numpy's matmul would stand in for the dot: see matmul.py
            s = tl.sum(q.to(tl.float32)[:, :, None] * kt.to(tl.float32)[None, :, :], axis=1)
            s = s * scale
        elif IEEE:      # float32 heads: no TF32 rounding
            s = tl.dot(q, kt, input_precision="ieee") * scale
        else:
            s = tl.dot(q, kt) * scale
        s = tl.where(jm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if INTERP:
            pv = p.to(vt.dtype).to(tl.float32)[:, :, None] * vt.to(tl.float32)[None, :, :]
            acc = acc * alpha[:, None] + tl.sum(pv, axis=1)
        elif IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + b * sob + h * soh + oq[:, None] * soq + od[None, :] * sod,
             out.to(o_ptr.dtype.element_ty), mask=qm)


@triton.jit
def _own_keys_kernel(q_ptr, k_ptr, v_ptr, o_ptr, idx_ptr, cnt_ptr,
                     H, G, D, scale,
                     sqb, sqh, sqq, sqd, skb, skh, skt, skd, svb, svh, svt, svd,
                     sob, soh, soq, sod, sib, siq, scb, scq,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    qi = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // G).to(tl.int64)
    od = tl.arange(0, BLOCK_D)
    dm = od < D
    q = tl.load(q_ptr + b * sqb + h * sqh + qi * sqq + od * sqd, mask=dm, other=0.0)
    q = q.to(tl.float32)
    n = tl.load(cnt_ptr + b * scb + qi * scq)
    # 0-d float32 starting values (reductions of constant blocks: plain tensors in any Triton)
    m_i = tl.max(tl.full((BLOCK_N,), float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for j0 in range(0, n, BLOCK_N):
        jj = j0 + tl.arange(0, BLOCK_N)
        jm = jj < n
        key = tl.load(idx_ptr + b * sib + qi * siq + jj, mask=jm, other=0).to(tl.int64)
        km = jm[:, None] & dm[None, :]
        kt = tl.load(k_ptr + b * skb + hk * skh + key[:, None] * skt + od[None, :] * skd,
                     mask=km, other=0.0).to(tl.float32)
        vt = tl.load(v_ptr + b * svb + hk * svh + key[:, None] * svt + od[None, :] * svd,
                     mask=km, other=0.0).to(tl.float32)
        s = tl.sum(q[None, :] * kt, axis=1) * scale
        s = tl.where(jm, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)
    tl.store(o_ptr + b * sob + h * soh + qi * soq + od * sod, out.to(o_ptr.dtype.element_ty),
             mask=dm)


def visible_keys(bias: torch.Tensor | None, B: int, T: int, device) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """(key indices [B, Qb, T] int32, visible ones first in ascending order; their counts
    [B, Qb] int32) of an additive visibility ``bias`` [B|1, 1, 1|Qb, T] (0: visible, the dtype's
    minimum: hidden); None: every key visible."""
    if bias is None:
        idx = torch.arange(T, device=device, dtype=torch.int32).expand(B, 1, T)
        return idx.contiguous(), torch.full((B, 1), T, dtype=torch.int32, device=device)
    if bias.dim() != 4 or bias.shape[1] != 1 or bias.shape[-1] != T:
        raise ValueError(f"batch-invariant attention: bias of shape {tuple(bias.shape)}; "
                         f"expected [B|1, 1, 1|Q, {T}] (one mask for every head)")
    hidden = (bias[:, 0] <= torch.finfo(bias.dtype).min).expand(B, -1, -1)
    idx = torch.sort(hidden.to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
    return idx.contiguous(), (~hidden).sum(-1, dtype=torch.int32)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
              enable_gqa: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale (None: 1 / sqrt(D)) over the keys ``bias`` leaves visible) v: ``q`` [B, H, Q, D],
    ``k``/``v`` [B, Hkv, T, D] (Hkv divides H), ``bias`` [B|1, 1, 1|Q, T] additive with values 0
    (visible) or the dtype's minimum (hidden) -> [B, H, Q, D] in ``q``'s dtype. A query with no
    visible key gets zeros."""
    B, H, Q, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    if H % Hkv or (Hkv != H and not enable_gqa):
        raise ValueError(f"batch-invariant attention: {H} query heads, {Hkv} key heads")
    idx, cnt = visible_keys(bias, B, T, q.device)
    o = torch.empty_like(q)
    if B * H * Q == 0:
        return o
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    bd = triton.next_power_of_2(D)
    common = (*q.stride(), *k.stride(), *v.stride(), *o.stride())
    if idx.shape[1] == 1:
        _shared_keys_kernel[(triton.cdiv(Q, BLOCK_M), B * H)](
            q, k, v, o, idx, cnt, H, H // Hkv, Q, D, scale, *common, idx.stride(0),
            cnt.stride(0), INTERP=interpreting(), IEEE=q.dtype == torch.float32,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=bd, num_warps=4, num_stages=2)
    else:
        if idx.shape[1] != Q:
            raise ValueError(f"batch-invariant attention: a mask of {idx.shape[1]} query rows "
                             f"for {Q} queries")
        _own_keys_kernel[(Q, B * H)](
            q, k, v, o, idx, cnt, H, H // Hkv, D, scale, *common, idx.stride(0), idx.stride(1),
            cnt.stride(0), cnt.stride(1), BLOCK_N=BLOCK_N, BLOCK_D=bd, num_warps=4)
    return o
