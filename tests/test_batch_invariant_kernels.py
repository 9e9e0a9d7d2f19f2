"""The batch-invariant kernels (``pvf_lmeval/models/batch_invariant``) under Triton's CPU
interpreter, on small shapes: every row of a request is bit-identical whatever rows, padding or
hidden keys surround it, and equal to torch's result within a stated tolerance.

Tolerance against a float64 reference: ``eps`` of the dtype (the spacing at 1: 2**-7 bfloat16,
2**-10 float16, 2**-23 float32) times the largest magnitude of the reference (four times for
attention: its float32 online softmax rounds at every key tile), plus ``eps`` times the value
itself (the rounding of the result to the dtype); norms: two roundings of the value (the
normalised row and its product with the weight), ``2 * eps`` relative, plus the dtype's smallest
normal number. Without Triton these tests skip, except in CI (``CI`` or
``PVF_REQUIRE_TRITON`` set), where a missing Triton fails them.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch
import torch.nn.functional as F

# Triton reads TRITON_INTERPRET when it defines a kernel (its own library's included), so the
# variable is set before Triton is first imported and stays set for the session.
os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton  # noqa: F401
except ImportError:
    if os.environ.get("CI") or os.environ.get("PVF_REQUIRE_TRITON"):
        raise
    pytest.skip("triton is not installed (pip install triton, or the [test] extra)",
                allow_module_level=True)


def _interpreted_kernels():
    """The kernel modules, defined under the interpreter (reloaded if defined without it; the
    custom ops of ``ops`` call them through their modules)."""
    mods = []
    for n in ("matmul", "norm", "attention"):
        full = f"pvf_lmeval.models.batch_invariant.{n}"
        mod = sys.modules.get(full)
        mods.append(importlib.reload(mod) if mod is not None else importlib.import_module(full))
    return (*mods, importlib.import_module("pvf_lmeval.models.batch_invariant.custom_ops"))


mm, norm, attn, bi_ops = _interpreted_kernels()
assert mm.interpreting()

from pvf_lmeval.models.ops import TORCH  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _close(got: torch.Tensor, ref: torch.Tensor, dtype, spread: float = 1.0) -> None:
    eps = torch.finfo(dtype).eps
    err = (got.double() - ref).abs()
    bound = spread * eps * ref.abs().max() + eps * ref.abs()
    assert bool((err <= bound).all()), float((err - bound).max())


def _rand(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_rows_do_not_depend_on_the_batch(dtype):
    K, N = 200, 40                                  # K: three BLOCK_K steps and a masked tail
    w, bias = _rand(N, K, dtype=dtype, seed=1), _rand(N, dtype=dtype, seed=2)
    big = _rand(130, K, dtype=dtype, seed=3)        # two row tiles of 128 (bfloat16 config)
    mine = big[127:130]                             # straddles the row tiles' border
    alone = mm.matmul(mine.clone(), w, bias)
    for batch, at in ((big, 127), (torch.cat([big[:5], mine]), 5), (mine, 0)):
        assert torch.equal(mm.matmul(batch, w, bias)[at:at + 3], alone)
    ref = mine.double() @ w.double().T + bias.double()
    _close(alone, ref, dtype)
    # the impl's linear: any leading shape, rows flattened
    y = bi_ops.BatchInvariantOps().linear(big[:6].view(2, 3, K), w, None)
    assert torch.equal(y.view(6, N)[1], mm.matmul(big[1:2], w)[0])


def test_grouped_linear_rows_do_not_depend_on_group_sizes():
    dtype = torch.bfloat16
    w = _rand(3, 24, 40, dtype=dtype, seed=4)       # 3 experts [N=24, K=40]
    x = _rand(6, 40, dtype=dtype, seed=5)
    impl = bi_ops.BatchInvariantOps()
    a = impl.grouped_linear(x, w, [2, 0, 4])        # row 2 in expert 2's group of 4
    b = impl.grouped_linear(x[2:3], w[2:3], [1])
    assert torch.equal(a[2], b[0])
    assert torch.equal(a[:2], mm.matmul(x[:2], w[0]))
    _close(a, TORCH.grouped_linear(x.double(), w.double(), [2, 0, 4]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", (96, 9000))           # one chunk; two chunks of 8192
def test_rms_norm_rows_do_not_depend_on_the_batch(dtype, D):
    x = _rand(5, D, dtype=dtype, seed=6) * 3
    w = (1 + 0.1 * _rand(D, dtype=torch.float32, seed=7)).to(dtype)
    y = norm.rms_norm(x, w, 1e-5)
    assert torch.equal(norm.rms_norm(x[3:4].clone(), w, 1e-5)[0], y[3])
    assert torch.equal(norm.rms_norm(x.view(5, 1, D), w, 1e-5).view(5, D), y)
    # torch's path (TorchOps), one rounding to the dtype in between: within two of its units
    ref = TORCH.rms_norm(x.double(), w.double(), 1e-5)
    eps = torch.finfo(dtype).eps
    bound = 2 * eps * ref.abs() + torch.finfo(dtype).tiny
    assert bool(((y.double() - ref).abs() <= bound).all())


def test_rms_norm_weight_in_float32_rounds_once():
    """``weight_fp32`` (SDAR's fused flash-attn norm): float32 ``x * r * w`` rounded to the dtype
    once; without it the normalised row is rounded first. Rows of exact sums of squares (36, 100
    over 4 values, ``eps`` 0): the reciprocal root is fl32(1/3), fl32(1/5) in any order, so both
    results are exact bits (as in ``test_rms_norm_rounding.py``). In float16: the interpreter
    casts float32 to bfloat16 by truncation (a GPU rounds to nearest), to float16 by numpy's
    rounding to nearest, as a GPU; the kernel's casts are the same code for both dtypes."""
    X = torch.tensor([[5.0, 1.0, -1.0, 3.0], [9.0, -3.0, 3.0, 1.0], [7.0, 5.0, -5.0, 1.0]])
    R = torch.tensor([[1 / 3], [1 / 5], [1 / 5]], dtype=torch.float32)
    W = torch.tensor([1 + 7 / 1024, 1 + 13 / 1024, 1 + 13 / 1024, 1 + 7 / 1024])  # float16's
    one = (X * R * W).half()
    two = ((X * R).half().float() * W).half()
    assert int((one != two).sum()) == 8
    x, w = X.half(), W.half()
    y = norm.rms_norm(x, w, 0.0, weight_fp32=True)
    assert torch.equal(y, one)
    assert torch.equal(norm.rms_norm(x, w, 0.0), two)
    assert torch.equal(norm.rms_norm(x[1:2].clone(), w, 0.0, weight_fp32=True)[0], y[1])
    assert torch.equal(bi_ops.BATCH_INVARIANT.rms_norm(x, w, 0.0, True), one)


def _pad_bias(pads: list[int], T: int, dtype) -> torch.Tensor:
    bias = torch.zeros(len(pads), 1, 1, T, dtype=dtype)
    for b, k in enumerate(pads):
        bias[b, ..., :k] = torch.finfo(dtype).min
    return bias


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_rows_do_not_depend_on_left_padding(dtype):
    H, Hkv, Q, D, real = 4, 2, 6, 16, 70           # 70 real keys: two key tiles of 64
    q = _rand(1, H, Q, D, dtype=dtype, seed=8)
    k, v = _rand(1, Hkv, real, D, dtype=dtype, seed=9), _rand(1, Hkv, real, D, dtype=dtype, seed=10)
    alone = attn.attention(q, k, v, None, True)
    for T, pad1 in ((75, 0), (100, 7), (133, 64)):  # the request: row 0 of a batch of two
        pad = T - real                              # left padding: its keys end at T
        pk = torch.zeros(2, Hkv, T, D, dtype=dtype)
        pv = torch.zeros_like(pk)
        pk[0, :, pad:], pv[0, :, pad:] = k[0], v[0]
        pk[1], pv[1] = _rand(Hkv, T, D, dtype=dtype, seed=11), _rand(Hkv, T, D, dtype=dtype, seed=12)
        pq = torch.cat([q, _rand(1, H, Q, D, dtype=dtype, seed=13)])
        bias = _pad_bias([pad, pad1], T, dtype)
        assert torch.equal(attn.attention(pq, pk, pv, bias, True)[0], alone[0]), T
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    _close(alone, ref, dtype, spread=4)


def test_attention_per_query_key_sets():
    """Cached-call masks ([B, 1, Q, T]): each query's result depends on its visible keys only,
    wherever they sit among hidden ones."""
    dtype = torch.bfloat16
    H, Q, D, T = 2, 3, 16, 12
    q = _rand(1, H, Q, D, dtype=dtype, seed=14)
    k, v = _rand(1, H, T, D, dtype=dtype, seed=15), _rand(1, H, T, D, dtype=dtype, seed=16)
    hide = torch.finfo(dtype).min
    bias = torch.zeros(1, 1, Q, T, dtype=dtype)
    bias[0, 0, 0, 8:] = hide                        # query 0: keys 0..7
    bias[0, 0, 1, 2:6] = hide                       # query 1: keys 0, 1, 6..11
    bias[0, 0, 2, :] = hide                         # query 2: none
    out = attn.attention(q, k, v, bias, False)
    assert torch.equal(out[0, :, 2], torch.zeros(H, D, dtype=dtype))
    # query 1's visible keys moved elsewhere, with more hidden keys between them
    keep = torch.tensor([0, 1, 6, 7, 8, 9, 10, 11])
    k2 = torch.zeros(1, H, 20, D, dtype=dtype)
    v2 = torch.zeros_like(k2)
    slots = torch.tensor([3, 4, 9, 10, 11, 15, 16, 19])
    k2[0, :, slots], v2[0, :, slots] = k[0, :, keep], v[0, :, keep]
    b2 = torch.full((1, 1, 2, 20), hide, dtype=dtype)
    b2[0, 0, :, slots] = 0
    out2 = attn.attention(q[:, :, 1:3], k2, v2, b2, False)
    assert torch.equal(out2[0, :, 0], out[0, :, 1])
    ref = F.scaled_dot_product_attention(q.double()[:, :, :2], k.double(), v.double(),
                                         attn_mask=bias[:, :, :2].double().clamp(min=-1e300))
    _close(out[:, :, :2], ref, dtype, spread=4)


@pytest.mark.parametrize("scale", [None, 1.0])
def test_attention_takes_a_scale(scale):
    """``scale`` replaces 1 / sqrt(D) (Gemma-4 scores q.k unscaled), through the custom op too."""
    dtype = torch.float32
    q = _rand(1, 2, 3, 16, dtype=dtype, seed=17)
    k, v = _rand(1, 1, 9, 16, dtype=dtype, seed=18), _rand(1, 1, 9, 16, dtype=dtype, seed=19)
    out = attn.attention(q, k, v, None, True, scale)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale,
                                         enable_gqa=True)
    _close(out, ref, dtype, spread=4)
    assert torch.equal(bi_ops.BatchInvariantOps().attention(q, k, v, None, True, scale), out)


def test_attention_rejects_a_per_head_bias():
    q = torch.zeros(1, 2, 1, 8)
    with pytest.raises(ValueError, match="one mask for every head"):
        attn.attention(q, q, q, torch.zeros(1, 2, 1, 1), False)


def test_network_logits_do_not_depend_on_the_batch():
    """A one-layer network through the kernels (``ops.use``: the model's own
    ``batch_invariant()`` picks the plain-torch implementation on the CPU): a request's logits
    alone equal its row's in a left-padded batch of two, bit for bit, and torch's within
    tolerance."""
    from pvf_lmeval.models import ops
    from pvf_lmeval.models.diffusion_lm import DiffusionLM
    from pvf_lmeval.models.transformer import BidirectionalTransformer, TransformerConfig

    cfg = TransformerConfig(vocab_size=24, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                            ffn_hidden=32, qkv_bias=True)
    net = BidirectionalTransformer(cfg)
    net.init_weights(0)
    m = DiffusionLM(net, mask_id=23, eos_ids=(2,), pad_id=3, logit_shift=0, decodable=24)
    mine = torch.tensor([[5, 6, 7, 23, 23, 23]])
    other = torch.tensor([[3, 3, 9, 10, 11, 12, 23, 23, 23]])     # 2 pads, 1 longer prompt
    batch = torch.cat([torch.cat([torch.full((1, 3), 3), mine], 1), other])
    att = (torch.arange(9)[None] >= torch.tensor([[3], [2]])).long()
    with ops.use(bi_ops.BATCH_INVARIANT):
        alone = m.logits(mine, torch.arange(3, 6))
        both = m.logits(batch, torch.arange(6, 9), attention_mask=att)
    assert torch.equal(both[0], alone[0])
    ref = m.logits(mine, torch.arange(3, 6))
    assert torch.allclose(alone, ref, rtol=1e-5, atol=1e-5)
