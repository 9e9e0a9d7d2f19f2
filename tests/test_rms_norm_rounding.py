"""RMSNorm's two roundings to the working dtype (``TransformerConfig.norm_weight_fp32``).

Hugging Face's RMSNorm (LLaDA, Dream, Qwen2/Qwen3-MoE files) rounds the float32 normalised
value to the working dtype, then multiplies by the weight there; flash-attn's fused
``rms_norm_fn`` (SDAR's ``modeling_sdar.py``, every norm of it) multiplies by the weight in float32
and rounds once. Pinned here: both conventions by hand in bfloat16 on rows where they differ, their
equality in float32, which family reads which, and that the network hands the flag to every
norm. The Triton kernel's two conventions: ``test_batch_invariant_kernels.py``.

The rows have exact float32 sums of squares (36 and 100 over 4 values) and ``eps`` 0, so the
reciprocal root is ``fl32(1/3)`` or ``fl32(1/5)`` whatever the reduction order; everything after it
is written out below."""

from __future__ import annotations

import pytest
import torch
from helpers.gemma_folders import gemma_config
from helpers.hub_folders import dream_config, llada_config
from helpers.moe_folders import llada2_config, lladamoe_config
from helpers.qwen_folders import fast_dllm_config, rnd1_config, sdar_config, sdar_moe_config

from pvf_lmeval.models import ops
from pvf_lmeval.models.batch_invariant import cpu
from pvf_lmeval.models.formats import FORMATS, format_for
from pvf_lmeval.models.transformer import BidirectionalTransformer, RMSNorm, TransformerConfig

BF16 = torch.bfloat16
#: mean of squares 9, 25, 25: reciprocal roots fl32(1/3), fl32(1/5), fl32(1/5)
X = torch.tensor([[5.0, 1.0, -1.0, 3.0], [9.0, -3.0, 3.0, 1.0], [7.0, 5.0, -5.0, 1.0]])
R = torch.tensor([[1 / 3], [1 / 5], [1 / 5]], dtype=torch.float32)
W = torch.tensor([1.0078125, 1.5, 1.5, 1.0078125])          # exact in bfloat16


def _one_rounding() -> torch.Tensor:
    """float32 ``x * r * w``, then bfloat16 once (flash-attn's kernel)."""
    return (X * R * W).to(BF16)


def _two_roundings() -> torch.Tensor:
    """float32 ``x * r`` to bfloat16, times the bfloat16 weight (an exact float32 product of two
    bfloat16 values, rounded once more)."""
    return ((X * R).to(BF16).float() * W).to(BF16)


def test_the_two_conventions_differ_on_these_rows():
    one, two = _one_rounding(), _two_roundings()
    # by hand, row 2 column 2: x * r = -3 * fl32(0.2) = -0.6000000089; times 1.5 = -0.90000001,
    # in bfloat16 (steps of 2**-8 in [0.5, 1)) -0.8984375; rounded first: -0.6 -> -0.6015625
    # (154/256), times 1.5 = -0.90234375 exactly
    assert (float(one[1, 1]), float(two[1, 1])) == (-0.8984375, -0.90234375)
    assert int((one != two).sum()) == 5


def test_torch_ops_rounds_once_with_the_flag_and_twice_without():
    x, w = X.to(BF16), W.to(BF16)
    assert torch.equal(ops.TORCH.rms_norm(x, w, 0.0, True), _one_rounding())
    assert torch.equal(ops.TORCH.rms_norm(x, w, 0.0, False), _two_roundings())
    assert torch.equal(ops.rms_norm(x, w, 0.0), _two_roundings())          # the default
    with ops.use(ops.TORCH):
        assert torch.equal(ops.rms_norm(x, w, 0.0, True), _one_rounding())


def test_in_float32_the_conventions_are_the_same_bits():
    """Both multiply two float32 values once: a float32 run is unchanged for every family."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, 96, generator=g) * 4
    w = 1 + 0.1 * torch.randn(96, generator=g)
    assert torch.equal(ops.TORCH.rms_norm(x, w, 1e-6, True), ops.TORCH.rms_norm(x, w, 1e-6))
    assert torch.equal(cpu.rms_norm(x, w, 1e-6, True), cpu.rms_norm(x, w, 1e-6))


def test_cpu_batch_invariant_path_takes_the_flag():
    """The CPU batch-invariant ops take the flag through ``ops.use`` and cover float32 only,
    where it changes no bit (so no test here can tell whether they apply it); on these rows
    (exact sums) they give TorchOps' bits either way, and they refuse bfloat16."""
    expected = X * R * W
    for flag in (True, False):
        assert torch.equal(cpu.rms_norm(X, W, 0.0, flag), expected)
        with ops.use(cpu.CPU_INVARIANT):
            assert torch.equal(ops.rms_norm(X, W, 0.0, flag), expected)
        assert torch.equal(ops.TORCH.rms_norm(X, W, 0.0, flag), expected)
    with pytest.raises(ValueError, match="covered: float32"):
        cpu.rms_norm(X.to(BF16), W.to(BF16), 0.0, True)


LLADA_IDS = {"mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081}
LLADA2_IDS = {"mask_token_id": 156895, "eos_token_id": 156892, "pad_token_id": 156892}
#: every supported model_type's published config (small shape); True where the reference's norms
#: are flash-attn's fused kernel: SDAR's file (SDAR-MoE's own file is not public: SDAR's is
#: followed); RND1's are transformers' Qwen3MoeRMSNorm (or vLLM's RMSNorm, the same rounding);
#: DiffusionGemma's (transformers' DiffusionGemmaRMSNorm) multiply by the weight in float32 too
CONFIGS = {
    "llada": (llada_config(126464, LLADA_IDS), False),
    "mmada": (llada_config(126464, LLADA_IDS, model_type="mmada", architectures=["MMadaModelLM"]),
              False),
    "Dream": (dream_config(), False),
    "lladamoe": (lladamoe_config(157184, LLADA2_IDS), False),
    "llada2_moe": (llada2_config(157184, LLADA2_IDS), False),
    "llada21_moe": (llada2_config(157184, LLADA2_IDS, model_type="llada21_moe"), False),
    "sdar": (sdar_config(), True),
    "sdar_moe": (sdar_moe_config(), True),
    "Fast_dLLM_Qwen": (fast_dllm_config(), False),
    "rnd1": (rnd1_config(), False),
    "diffusion_gemma": (gemma_config(), True),
}


def test_only_the_sdar_readers_ask_for_the_fused_rounding():
    assert set(FORMATS) == set(CONFIGS)                        # a new family needs a decision
    got = {}
    for name, (cfg, _) in CONFIGS.items():
        fmt = format_for(cfg)
        got[name] = (fmt.model_type, fmt.read_config(cfg).norm_weight_fp32)
    assert got == {name: (name, flag) for name, (_, flag) in CONFIGS.items()}


@pytest.mark.parametrize("flag", (True, False))
def test_every_norm_of_the_network_gets_the_flag(flag):
    """input, post-attention and final norms and the per-head query/key norms alike."""
    cfg = TransformerConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1,
                            ffn_hidden=8, qk_norm=True, norm_weight_fp32=flag)
    norms = [m for m in BidirectionalTransformer(cfg).modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * 4 + 1
    assert all(m.weight_fp32 is flag for m in norms)
