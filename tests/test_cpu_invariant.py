"""The CPU's batch-invariant implementation (``pvf_lmeval/models/batch_invariant/cpu.py``): every
row is bit-identical whatever rows, left padding or hidden keys surround it, at one and at two
torch threads, and equal to a float64 reference within a stated float32 tolerance.

Tolerances (``eps`` = 2**-23, float32's spacing at 1): a product over ``K`` terms within
``K * eps`` times the sum of the terms' magnitudes (the classical bound of a float32 dot
product in any order) plus ``eps`` of the value (the bias added after); a norm within
``(D / 2 + 2) * eps`` relative (a sum of ``D`` squares, its square root, two roundings);
attention within ``16 * eps`` times the largest magnitude of a value (measured: under 2).
torch's own float32 result lies within the same bound of the reference, so mine and torch's
differ by at most twice it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pvf_lmeval.models import ops
from pvf_lmeval.models.batch_invariant import cpu

EPS = torch.finfo(torch.float32).eps
HIDE = torch.finfo(torch.float32).min

#: (K, N) of the bundled fixtures' products: q/o, GQA keys, MLP up and down, the two LM heads
FIXTURE_SHAPES = ((128, 128), (128, 64), (128, 384), (384, 128), (128, 691), (128, 768))


@pytest.fixture(params=(1,))
def threads(request):
    """torch's thread count for the test (1 unless parametrized indirectly): a library may
    split one product across threads by its shape."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _threads(*counts):
    return pytest.mark.parametrize("threads", counts, indirect=True)


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _within_product_bound(got, x, w, bias=None):
    ref = x.double() @ w.double().T + (0 if bias is None else bias.double())
    K = x.shape[-1]
    bound = K * EPS * (x.double().abs() @ w.double().abs().T) + EPS * ref.abs()
    assert bool(((got.double() - ref).abs() <= bound).all())


@_threads(1, 2)
@pytest.mark.parametrize("K, N", FIXTURE_SHAPES)
def test_matmul_rows_do_not_depend_on_row_count_place_or_neighbours(threads, K, N):
    w, b = _rand(N, K, seed=K + N), _rand(N, seed=1)
    x = _rand(300, K, seed=N)
    alone = cpu.matmul(x[:1], w, b)
    g = torch.Generator().manual_seed(threads)
    for M in (2, 3, 9, 63, 64, 65, 200):
        rows = x[torch.randperm(300, generator=g)[:M]]
        at = int(torch.randint(M, (1,), generator=g))
        rows[at] = x[0]
        assert torch.equal(cpu.matmul(rows, w, b)[at], alone[0]), (M, at)
    _within_product_bound(alone, x[:1], w, b)
    torch_row = F.linear(x[:1], w, b)
    _within_product_bound(torch_row, x[:1], w, b)


def test_linear_keeps_leading_dims_and_matches_torch():
    x, w = _rand(3, 5, 128, seed=0), _rand(64, 128, seed=1)
    got = cpu.CPU_INVARIANT.linear(x, w)
    assert got.shape == (3, 5, 64)
    assert torch.equal(got[1, 2], cpu.matmul(x[1, 2:3], w)[0])
    _within_product_bound(got, x, w)
    assert cpu.matmul(x[0, :0], w).shape == (0, 64)


def test_grouped_linear_rows_do_not_depend_on_group_sizes(threads):
    w = _rand(3, 48, 128, seed=2)
    x = _rand(70, 128, seed=3)
    a = cpu.CPU_INVARIANT.grouped_linear(x, w, [1, 66, 3])
    b = cpu.CPU_INVARIANT.grouped_linear(x[:2], w, [0, 2, 0])
    assert torch.equal(a[:2], torch.cat([cpu.matmul(x[:1], w[0]), cpu.matmul(x[1:2], w[1])]))
    assert torch.equal(b, cpu.matmul(x[:2], w[1]))
    assert cpu.CPU_INVARIANT.grouped_linear(x[:0], w, [0, 0, 0]).shape == (0, 48)


@pytest.mark.parametrize("D, threads", ((32, 1), (128, 1), (40000, 2)), indirect=["threads"])
def test_rms_norm_rows_do_not_depend_on_the_batch(threads, D):
    """D = 40000: one row of more than 32768 values is the case torch's mean splits across
    threads (alone it is one output); the fixed-order sum does not."""
    x, w = _rand(5, D, seed=D), _rand(D, seed=4)
    batch = cpu.rms_norm(x, w, 1e-5)
    for i in range(5):
        assert torch.equal(cpu.rms_norm(x[i:i + 1], w, 1e-5)[0], batch[i]), i
    alone = cpu.rms_norm(x[2:3], w, 1e-5)
    assert torch.equal(cpu.rms_norm(x[None].transpose(0, 1), w, 1e-5)[2, 0], alone[0])
    xd = x[2].double()
    ref = w.double() * xd / torch.sqrt(xd.pow(2).mean() + 1e-5)
    err = (alone[0].double() - ref).abs()
    assert bool((err <= (D / 2 + 2) * EPS * ref.abs() + torch.finfo(torch.float32).tiny).all())
    assert torch.allclose(alone, ops.TORCH.rms_norm(x[2:3], w, 1e-5), rtol=D * EPS, atol=0)


def _padded(rows: list, D: int, H: int, Hkv: int):
    """q, k, v of entries left-padded to the longest, and the additive bias hiding the pads:
    ``rows`` [(q [H, T, D], k [Hkv, T, D], v [Hkv, T, D])]."""
    T = max(r[0].shape[1] for r in rows)
    q = torch.zeros(len(rows), H, T, D)
    k, v = (torch.zeros(len(rows), Hkv, T, D) for _ in range(2))
    bias = torch.zeros(len(rows), 1, 1, T)
    for i, (a, b, c) in enumerate(rows):
        pad = T - a.shape[1]
        q[i, :, pad:], k[i, :, pad:], v[i, :, pad:] = a, b, c
        q[i, :, :pad] = 7.0                         # padding holds values, never zeros only
        k[i, :, :pad] = 5.0
        bias[i, ..., :pad] = HIDE
    return q, k, v, bias


def _entry(T, seed, H=4, Hkv=2, D=32):
    return _rand(H, T, D, seed=seed), _rand(Hkv, T, D, seed=seed + 1), \
        _rand(Hkv, T, D, seed=seed + 2)


def _reference(q, k, v):
    G = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(G, 1),
                                          v.double().repeat_interleave(G, 1))


@pytest.mark.parametrize("T0", (5, 200))
def test_attention_rows_do_not_depend_on_left_padding_or_the_batch(threads, T0):
    """A request alone (no mask) and in batches whose widest entry makes its keys start later
    and its packed width (whole tiles of 64) larger: 300 and 520 keys pass the 256-key length
    past which one library product over all keys would split its sum differently."""
    mine = _entry(T0, seed=T0)
    alone = cpu.attention(*(t[None] for t in mine), None, True)[0]
    for others in ((3,), (300, 17), (520,)):
        batch = [_entry(t, seed=t) for t in others] + [mine]
        q, k, v, bias = _padded(batch, 32, 4, 2)
        got = cpu.attention(q, k, v, bias, True)[-1, :, -T0:]
        assert torch.equal(got, alone), others
    ref = _reference(*(t[None] for t in mine))[0]
    assert bool(((alone.double() - ref).abs() <= 16 * EPS * mine[2].abs().max()).all())
    torch_out = F.scaled_dot_product_attention(*(t[None] for t in mine), enable_gqa=True)[0]
    assert bool(((torch_out.double() - ref).abs() <= 16 * EPS * mine[2].abs().max()).all())


def _cached_call(entries, S: int, nmax: int, pad_to: int):
    """Queries of cached-call shape: per entry (request) ``n`` rows of ``ln`` valid span
    positions in slots of ``S`` (``nmax`` rows each), against ``Tc`` cached keys (left-padded to
    ``pad_to``) and then all rows' fresh keys; a query sees the cached keys and its own row's
    valid fresh keys. ``entries`` [(Tc, n, ln, seed)] -> q, k, v, bias."""
    H, Hkv, D = 4, 2, 32
    Q = nmax * S
    q = torch.zeros(len(entries), H, Q, D)
    k, v = (torch.zeros(len(entries), Hkv, pad_to + Q, D) for _ in range(2))
    keep = torch.zeros(len(entries), Q, pad_to + Q, dtype=torch.bool)
    for e, (Tc, n, ln, seed) in enumerate(entries):
        g = torch.Generator().manual_seed(seed)
        pad = pad_to - Tc
        k[e, :, pad:pad_to] = torch.randn(Hkv, Tc, D, generator=g)
        v[e, :, pad:pad_to] = torch.randn(Hkv, Tc, D, generator=g)
        for i in range(nmax):
            r = min(i, n - 1)             # slots past the request's rows repeat its last row
            g_row = torch.Generator().manual_seed(seed * 100 + r)
            q[e, :, i * S:i * S + ln] = torch.randn(H, ln, D, generator=g_row)
            k[e, :, pad_to + i * S:pad_to + i * S + ln] = torch.randn(Hkv, ln, D, generator=g_row)
            v[e, :, pad_to + i * S:pad_to + i * S + ln] = torch.randn(Hkv, ln, D, generator=g_row)
            rows = slice(i * S, (i + 1) * S)
            keep[e, rows, pad:pad_to] = True
            keep[e, rows, pad_to + i * S:pad_to + i * S + ln] = True
    bias = torch.zeros(keep.shape).masked_fill_(~keep, HIDE)[:, None]
    return q, k, v, bias


@_threads(1, 2)
def test_attention_per_query_key_sets_do_not_depend_on_the_batch(threads):
    """Cached-call masks: a request of 3 rows with spans of 8, alone, then beside a request
    with 5 rows, spans of 20 and a longer cache (more rows per entry, wider slots, more left
    padding of its cached keys, other rows' fresh keys between its own)."""
    alone = cpu.attention(*_cached_call([(40, 3, 8, 11)], S=8, nmax=3, pad_to=40), True)
    q, k, v, bias = _cached_call([(130, 5, 20, 12), (40, 3, 8, 11)], S=20, nmax=5, pad_to=130)
    both = cpu.attention(q, k, v, bias, True)
    for i in range(3):
        assert torch.equal(both[1, :, i * 20:i * 20 + 8], alone[0, :, i * 8:i * 8 + 8]), i
    # the reference with the same mask
    G = 2
    ref = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(G, 1),
                                         v.double().repeat_interleave(G, 1),
                                         attn_mask=bias.double().clamp(min=-1e300))
    assert bool(((both.double() - ref).abs()[1, :, :8] <= 16 * EPS * v.abs().max()).all())


def test_attention_query_without_visible_keys_gets_zeros():
    q, k, v = _rand(1, 2, 3, 16, seed=5), _rand(1, 2, 4, 16, seed=6), _rand(1, 2, 4, 16, seed=7)
    bias = torch.zeros(1, 1, 3, 4)
    bias[0, 0, 1] = HIDE
    out = cpu.attention(q, k, v, bias)
    assert torch.equal(out[0, :, 1], torch.zeros(2, 16))
    assert not out[0, :, 0].eq(0).all()


def test_attention_takes_a_scale():
    """``scale`` replaces 1 / sqrt(D) (Gemma-4 scores q.k unscaled), through ``ops`` as well."""
    q, k, v = _rand(1, 2, 3, 16, seed=8), _rand(1, 1, 5, 16, seed=9), _rand(1, 1, 5, 16, seed=10)
    for scale in (None, 1.0):
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale,
                                             enable_gqa=True)
        for got in (cpu.attention(q, k, v, None, True, scale),
                    cpu.CPU_INVARIANT.attention(q, k, v, None, True, scale)):
            assert bool(((got.double() - ref).abs() <= 16 * EPS * v.abs().max()).all())
        with ops.use(cpu.CPU_INVARIANT):
            assert torch.equal(ops.attention(q, k, v, None, True, scale),
                               cpu.attention(q, k, v, None, True, scale))
    assert not torch.allclose(cpu.attention(q, k, v, None, True, 1.0),
                              cpu.attention(q, k, v, None, True), atol=1e-3)


def test_attention_rejects_a_per_head_bias_and_unsupported_dtypes():
    q = torch.zeros(1, 2, 1, 8)
    with pytest.raises(ValueError, match="one mask for every head"):
        cpu.attention(q, q, q, torch.zeros(1, 2, 1, 1))
    with pytest.raises(ValueError, match=r"^batch-invariant CPU matmul: dtype torch.bfloat16; "):
        cpu.matmul(torch.zeros(2, 4, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16))


def test_network_logits_alone_equal_its_row_in_a_padded_batch(threads):
    """A small network through DiffusionLM.batch_invariant() on the CPU: a request's logits
    alone equal its row's in a left-padded batch, full and last-layer rows, bit for bit."""
    from pvf_lmeval.models.diffusion_lm import DiffusionLM
    from pvf_lmeval.models.transformer import BidirectionalTransformer, TransformerConfig

    cfg = TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            ffn_hidden=64, qkv_bias=True)
    net = BidirectionalTransformer(cfg)
    net.init_weights(0)
    m = DiffusionLM(net, mask_id=39, eos_ids=(2,), pad_id=3, logit_shift=0, decodable=40)
    mine = torch.tensor([[5, 6, 7, 39, 39, 39]])
    other = torch.tensor([[9, 10, 11, 12] * 20 + [39] * 3])         # 77 more key columns
    pad = other.shape[1] - mine.shape[1]
    batch = torch.cat([torch.cat([torch.full((1, pad), 3), mine], 1), other])
    att = (torch.arange(batch.shape[1])[None] >= torch.tensor([[pad], [0]])).long()
    with m.batch_invariant():
        alone = m.logits(mine, torch.arange(3, 6))
        both = m.logits(batch, torch.arange(pad + 3, pad + 6), attention_mask=att)
    assert torch.equal(both[0], alone[0])
    with ops.use(ops.TORCH):
        ref = m.logits(mine, torch.arange(3, 6))
    assert torch.allclose(alone, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ("silu", "gelu_tanh"))
@pytest.mark.parametrize("width", (16, 48, 64, 200))
def test_activation_rows_do_not_depend_on_the_row_count(threads, name, width):
    """torch's CPU activation kernels take a tensor's last partial vector step through scalar
    code that rounds differently; under the batch-invariant ops a row's activation is the same
    bits whatever the rows around it, also at widths that are no multiple of that step."""
    x = _rand(37, width, seed=width)
    act = ops.ACTIVATIONS[name]
    with ops.use(cpu.CPU_INVARIANT):
        together = ops.activation(x, name)
        for r in range(x.shape[0]):
            assert torch.equal(ops.activation(x[r:r + 1], name), together[r:r + 1]), (name, r)
    assert torch.allclose(together, act(x), rtol=1e-6, atol=1e-7)


def test_diffusion_gemma_logits_alone_equal_its_row_in_a_batch(tmp_path):
    """DiffusionGemma's tiny folder (GeGLU at widths 48 and 16, no multiple of the vector step)
    through DiffusionLM.batch_invariant(): a request's logits alone equal its row's in batches
    of 2 and 3, bit for bit."""
    from helpers.gemma_folders import make_gemma_folder

    from pvf_lmeval.models import load_model

    m = load_model(str(make_gemma_folder(tmp_path / "dg", seed=1, canvas_length=8)),
                   device="cpu", dtype="float32")
    tokens = torch.randint(2, 400, (3, 13), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5, 13)
    with torch.no_grad(), m.batch_invariant():
        alone = m.logits(tokens[:1], positions)
        for n in (2, 3):
            assert torch.equal(m.logits(tokens[:n], positions)[:1], alone), n
