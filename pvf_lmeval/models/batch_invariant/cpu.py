"""The batch-invariant implementation of the network's numeric entry points on the CPU, in plain
torch (float32): a row's result is bit-identical whatever batch, padding and batch composition
it is computed in.

A CPU matrix product (MKL, OpenBLAS) picks its kernel, blocking and thread split by the shape
of the whole call: one row gets a matrix-vector kernel, two or three rows another, and a long
reduction is cut into blocks whose boundaries depend on its length. Every product here is
therefore a batch of calls of one fixed shape, so that every row and every dot product meets
the same kernel whatever the batch:

- ``linear``: the rows in chunks of :data:`ROWS` (the last one padded with zeros), one
  ``[ROWS, K] @ [K, N]`` product per chunk (a row's result depends neither on the chunk it
  falls in nor on its place there);
- ``attention``: each batch entry's visible keys packed in order from its first visible key
  (padding, recomputed spans and keys no query of the entry sees take no place), ``W`` of them
  (whole tiles of :data:`KEYS`); per chunk of :data:`QUERIES` queries the scores by
  ``[QUERIES, D] @ [D, W]`` products (a score reduces over ``D`` only, whatever ``W``), an exact
  maximum, the exponentials, and per tile the weighted sum of the values by a ``[QUERIES, KEYS]
  @ [KEYS, D]`` product and the normaliser by a sum over the tile, both added up tile after
  tile: a wider batch only adds tiles of exact zeros at the end;
- ``rms_norm``: the sum of squares by ``fixed_sum``;
- ``grouped_linear``: each group through ``linear``;
- ``rank_sum`` (tensor parallel): the ranks' partials gathered and added in rank order.

The fixed shapes are verified properties of the CPU libraries rather than documented ones; the
tests (tests/test_cpu_invariant.py) check them on every CI run.

The functions are also registered as torch custom ops (``pvf_cpu::...``), which stand for them
under ``torch.compile``: each stays one opaque call (attention reads its number of visible keys
on the host).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...tensors.fixed_order import fixed_sum

#: rows of every matrix-product call of ``linear`` (the row count picks the CPU kernel)
ROWS = 64
#: queries per attention score product (its row count)
QUERIES = 64
#: packed keys per tile of attention's weighted sum over values (its reduction length)
KEYS = 64
#: the dtypes covered: float32 (other dtypes take other library kernels, unverified)
DTYPES = (torch.float32,)


def _check(name: str, *tensors: Tensor) -> None:
    for t in tensors:
        if t.dtype not in DTYPES:
            raise ValueError(f"batch-invariant CPU {name}: dtype {t.dtype}; covered: float32")


def matmul(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x`` [M, K] @ ``weight`` [N, K].T (+ ``bias`` [N]) -> [M, N], the rows in chunks of
    :data:`ROWS`, one fixed-shape product per chunk."""
    _check("matmul", x, weight)
    M, K = x.shape
    N = weight.shape[0]
    n = -(-M // ROWS)
    xp = x.new_zeros(n * ROWS, K)
    xp[:M] = x
    y = torch.bmm(xp.view(n, ROWS, K), weight.t().expand(n, K, N)).view(n * ROWS, N)[:M]
    # the bias added after the product, elementwise
    return y if bias is None else y + bias


def _visible(bias: Tensor | None, B: int, T: int, device) -> Tensor:
    """[B, 1|Q, T] bool: the keys an additive ``bias`` [B|1, 1, 1|Q, T] leaves visible (0;
    the dtype's minimum or -inf hides); None: every key."""
    if bias is None:
        return torch.ones(B, 1, T, dtype=torch.bool, device=device)
    if bias.dim() != 4 or bias.shape[1] != 1 or bias.shape[-1] != T:
        raise ValueError(f"batch-invariant attention: bias of shape {tuple(bias.shape)}; "
                         f"expected [B|1, 1, 1|Q, {T}] (one mask for every head)")
    return (bias[:, 0] > torch.finfo(bias.dtype).min).expand(B, -1, -1)


def _packed(k: Tensor, v: Tensor, vis: Tensor):
    """Each batch entry's keys that some query sees, in order, from the first one: keys and
    values [B, Hkv, W, D], visibility per query [B, 1|Q, W] (False past the entry's count);
    ``W`` is the largest count rounded up to whole tiles of :data:`KEYS`."""
    B, Hkv, T, D = k.shape
    seen = vis.any(1)                                                          # [B, T]
    order = torch.sort((~seen).to(torch.uint8), dim=-1, stable=True).indices  # seen first
    count = seen.sum(-1)                                                       # [B]
    W = KEYS * max(1, -(-int(count.max()) // KEYS))                            # one host read
    take = min(W, T)
    order = order[:, :take]
    inside = torch.arange(take, device=k.device) < count[:, None]             # [B, take]
    # rows of (key, head) pairs picked by one index_select (keys are [B, T, Hkv, D] in memory
    # when they come from a linear projection: the reshape is then a view)
    rows = (order + T * torch.arange(B, device=k.device)[:, None]).reshape(-1)
    kp, vp = k.new_zeros(B, Hkv, W, D), v.new_zeros(B, Hkv, W, D)
    for src, dst in ((k, kp), (v, vp)):
        picked = src.transpose(1, 2).reshape(B * T, Hkv * D).index_select(0, rows)
        dst[:, :, :take] = picked.view(B, take, Hkv, D).transpose(1, 2)
    pvis = vis.new_zeros(B, vis.shape[1], W)
    pvis[..., :take] = vis.gather(2, order[:, None].expand(B, vis.shape[1], take)) & inside[:, None]
    return kp, vp, pvis


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
              enable_gqa: bool = False, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale (None: 1 / sqrt(D)) over the keys ``bias`` leaves visible) v: ``q`` [B, H, Q, D],
    ``k``/``v`` [B, Hkv, T, D] (Hkv divides H), ``bias`` [B|1, 1, 1|Q, T] additive, 0 where
    visible, the dtype's minimum (or -inf) where hidden -> [B, H, Q, D]. A query with no visible
    key gets zeros. A query's result depends on its own query, its entry's packed keys and which
    of them it sees: never on hidden keys around them nor on the other entries of the call.

    Per chunk of :data:`QUERIES` queries: the scores against all ``W`` packed keys by one
    ``[QUERIES, D] @ [D, W]`` product per head (a score does not depend on ``W``: the product
    reduces over ``D`` only), the maximum (exact), the exponentials; then per tile of
    :data:`KEYS` packed keys the weighted sum of the values by a ``[QUERIES, KEYS] @ [KEYS, D]``
    product and the normaliser by a sum over the tile's row, both added over the tiles in tile
    order (tiles past an entry's keys add exact zeros)."""
    _check("attention", q, k, v)
    B, H, Q, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    if H % Hkv or (Hkv != H and not enable_gqa):
        raise ValueError(f"batch-invariant attention: {H} query heads, {Hkv} key heads")
    if B * H * Q == 0:
        return torch.zeros_like(q)
    vis = _visible(bias, B, T, q.device)
    kp, vp, pvis = _packed(k, v, vis)
    W = kp.shape[2]
    BH, G = B * Hkv, H // Hkv
    # the queries of one key head together: rows (g, q) of [B * Hkv, G * Q, D], scaled here
    rows = G * Q
    n = -(-rows // QUERIES) * QUERIES
    qg = q.new_zeros(BH, n, D)
    qg[:, :rows] = q.reshape(BH, rows, D) * (1.0 / math.sqrt(D) if scale is None else scale)
    hide = torch.zeros(pvis.shape, dtype=q.dtype, device=q.device).masked_fill_(~pvis, -math.inf)
    if hide.shape[1] > 1:          # a key set per query: the same one for each head of a group
        hide = hide[:, None].expand(B, G, Q, W).reshape(B, rows, W)
        hide = torch.cat([hide, hide.new_zeros(B, n - rows, W)], 1)
    kt = kp.view(BH, W, D).transpose(1, 2)                                  # [BH, D, W]
    vt = vp.view(BH, W, D)
    nt = W // KEYS
    hide = hide.index_select(0, torch.arange(BH, device=q.device) // Hkv)   # [BH, 1|n, W]
    out = q.new_empty(BH, n, D)
    for c in range(0, n, QUERIES):
        qs = slice(c, c + QUERIES)
        s = torch.bmm(qg[:, qs], kt)                                         # [BH, QC, W]
        s.add_(hide[:, qs] if hide.shape[1] > 1 else hide)
        # the exact maximum; a query seeing no key keeps -inf scores, zero weights
        p = s.sub_(s.amax(-1, keepdim=True).clamp_(min=torch.finfo(q.dtype).min)).exp_()
        # each tile's normaliser: a sum over a contiguous row of KEYS weights (the CPU splits
        # a reduction over rows, never a row, when there are several)
        part = p.view(BH, QUERIES, nt, KEYS).sum(-1)                          # [BH, QC, nt]
        acc, den = torch.bmm(p[..., :KEYS], vt[:, :KEYS]), part[..., 0]
        for t in range(1, nt):        # the tiles in order: tiles past the keys add zeros
            acc.baddbmm_(p[..., t * KEYS:(t + 1) * KEYS], vt[:, t * KEYS:(t + 1) * KEYS])
            den = den + part[..., t]
        torch.div(acc, den.clamp_(min=torch.finfo(q.dtype).tiny)[..., None], out=out[:, qs])
    return out[:, :rows].reshape(B, H, Q, D)


def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_fp32: bool = False) -> Tensor:
    """``weight * (x / sqrt(mean(x**2) + eps))`` over the last dim of ``x``, normalised in
    float32 and returned in ``x``'s dtype, the weight applied as ``TorchOps.rms_norm`` does
    (``weight_fp32``: in float32 before the rounding); the sum of squares by ``fixed_sum``."""
    _check("rms_norm", x)
    xf = x.float()
    xf = xf * torch.rsqrt(fixed_sum(xf * xf) / x.shape[-1] + eps)[..., None]
    if weight_fp32:
        return (xf * weight.float()).to(x.dtype)
    return weight * xf.to(x.dtype)


@torch.library.custom_op("pvf_cpu::matmul", mutates_args=())
def _matmul_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return matmul(x, weight, bias)


@_matmul_op.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("pvf_cpu::attention", mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                  enable_gqa: bool, scale: float | None = None) -> Tensor:
    return attention(q, k, v, bias, enable_gqa, scale)


@_attention_op.register_fake
def _(q, k, v, bias, enable_gqa, scale=None):
    return torch.empty_like(q)


@torch.library.custom_op("pvf_cpu::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor, eps: float, weight_fp32: bool) -> Tensor:
    return rms_norm(x, weight, eps, weight_fp32)


@_rms_norm_op.register_fake
def _(x, weight, eps, weight_fp32):
    return torch.empty_like(x)


def _compiling() -> bool:
    """Whether torch.compile is tracing the call (older torch: never asked, False)."""
    probe = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(probe and probe())


#: elements per vectorised step of torch's CPU activation kernels: the elements of a tensor's
#: last, partial step go through a scalar loop whose transcendental functions round
#: differently, so which elements those are must not follow the number of rows
LANES = 64


def activation(x: Tensor, name: str) -> Tensor:
    """:data:`ops.ACTIVATIONS` ``[name]`` of ``x`` with its last dimension zero-padded to a
    multiple of :data:`LANES`: every row's elements go through the vectorised loop, whatever
    the number of rows."""
    from ..ops import ACTIVATIONS

    n = x.shape[-1]
    pad = -n % LANES
    if pad == 0:
        return ACTIVATIONS[name](x)
    return ACTIVATIONS[name](torch.nn.functional.pad(x, (0, pad)))[..., :n]


class CpuInvariantOps:
    """``linear``, ``attention``, ``rms_norm`` and ``grouped_linear`` in fixed-shape products
    and fixed-order sums (see the module docstring); the signatures of ``ops.TorchOps``. Eager
    calls run the functions directly (a custom op's first call imports torch's compiler);
    under ``torch.compile`` the custom ops stand for them."""

    name = "cpu_invariant"

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None):
        x2 = x.reshape(-1, x.shape[-1])
        f = _matmul_op if _compiling() else matmul
        return f(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    def attention(self, q, k, v, bias, enable_gqa: bool, scale: float | None = None):
        return (_attention_op if _compiling() else attention)(q, k, v, bias, bool(enable_gqa),
                                                              scale)

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float, weight_fp32: bool = False) -> Tensor:
        return (_rms_norm_op if _compiling() else rms_norm)(x, weight, float(eps),
                                                             bool(weight_fp32))

    def grouped_linear(self, x: Tensor, weight: Tensor, group_sizes: list[int]):
        # each group's rows in the fixed-shape chunks: a row's result depends on its own values
        # and its group's weight only, never on the groups' sizes
        f = _matmul_op if _compiling() else matmul
        outs = [f(part, w, None) for part, w in zip(x.split(group_sizes), weight) if part.numel()]
        return torch.cat(outs) if outs else x.new_zeros(0, weight.shape[1])

    def activation(self, x: Tensor, name: str) -> Tensor:
        return activation(x, name)

    def rank_sum(self, x: Tensor, comm) -> Tensor:
        # the partials gathered and added in rank order: an element's sum never depends on
        # the message size, which an all-reduce's order may follow
        return comm.ordered_sum(x.float())


CPU_INVARIANT = CpuInvariantOps()
