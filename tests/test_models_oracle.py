"""The native bidirectional transformer against transformers' Llama/Qwen2 run with is_causal=False.

LLaDA layout (no biases, MHA) is compared with ``LlamaForCausalLM``; Dream layout (q/k/v bias, GQA)
with ``Qwen2ForCausalLM``. Both oracles are built from the tensors in the checkpoint file, renamed
by the checkpoint format (``to_native``) and then to Qwen2/Llama names, so the comparison covers
the on-disk names, the config reader, the loader and ``DiffusionLM.logits`` (Dream's shift, the
undecodable tail of the head, padding). Runs on random temporary checkpoints in both formats and
on the bundled ``tiny-llada`` / ``tiny-dream`` fixtures once their weights exist.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from helpers.prerequisites import require_bundled_weights

from pvf_lmeval.models import load_model
from pvf_lmeval.models.formats import DREAM, LLADA, format_for
from pvf_lmeval.models.loader import FIXTURES_DIR, _weight_files, save_checkpoint
from pvf_lmeval.models.transformer import BidirectionalTransformer, TransformerConfig

REL_TOL = 1e-4
ATTN_IMPLS = ("sdpa", "eager")
CASES = ("llada-temp", "dream-temp", "tiny-llada", "tiny-dream")


# These nets are tiny: one intra-op thread is faster than two on a shared, busy CPU.
pytestmark = pytest.mark.usefixtures("one_thread")


# --- temporary checkpoints ------------------------------------------------------------------------

def _randomise(net: BidirectionalTransformer, seed: int) -> None:
    """Weights large enough that every component (norm gains, biases, rope) moves the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.2 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)


def make_temp_checkpoint(folder: Path, family: str, seed: int = 0) -> Path:
    """A random native net saved with ``save_checkpoint`` in ``family``'s format, plus the tokenizer
    files of the matching bundled fixture. Dream's head is wider than its tokenizer, as in Dream-7B."""
    src = FIXTURES_DIR / f"tiny-{family}"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder / name)
    vocab = json.loads((src / "tokenizer.json").read_text())
    ids = dict(vocab["model"]["vocab"])
    ids.update({t["content"]: t["id"] for t in vocab["added_tokens"]})
    n_tok = max(ids.values()) + 1
    if family == "llada":
        fmt = LLADA
        cfg = TransformerConfig(vocab_size=n_tok, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4,
                                ffn_hidden=96, norm_eps=1e-5, rope_theta=500000.0, qkv_bias=False,
                                max_seq_len=256)
        special = {"mask_token_id": ids["<|mdm_mask|>"], "eos_token_id": ids["<|endoftext|>"],
                   "pad_token_id": ids["<|endoftext|>"]}
    else:
        fmt = DREAM
        cfg = TransformerConfig(vocab_size=n_tok + 34, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                ffn_hidden=96, norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True,
                                max_seq_len=256)
        special = {"mask_token_id": ids["<|mask|>"], "eos_token_id": ids["<|endoftext|>"],
                   "pad_token_id": ids["<|endoftext|>"]}
    net = BidirectionalTransformer(cfg)
    _randomise(net, seed)
    save_checkpoint(net, fmt, folder, special)
    return folder


# --- the transformers oracle ----------------------------------------------------------------------

def hf_oracle(folder: Path, attn_impl: str):
    """Llama (LLaDA) or Qwen2 (Dream) with is_causal=False, from the tensors in ``folder``'s files."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    fmt = format_for(config)
    c = fmt.read_config(config)
    common = dict(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.ffn_hidden,
                  num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                  num_key_value_heads=c.n_kv_heads, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
                  max_position_embeddings=c.max_seq_len, tie_word_embeddings=False, is_causal=False,
                  hidden_act="silu", attn_implementation=attn_impl)
    if fmt is LLADA:
        assert not c.qkv_bias
        hf_cfg = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        cls = transformers.LlamaForCausalLM
    else:
        hf_cfg = transformers.Qwen2Config(use_sliding_window=False, **common)
        cls = transformers.Qwen2ForCausalLM
    state = {}
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                # Qwen2 and Llama share parameter names, and Dream's names are Qwen2's.
                state[DREAM.from_native(fmt.to_native(name))] = f.get_tensor(name).float()
    model = cls(hf_cfg).eval()
    model.load_state_dict(state, strict=True)
    return model


def hf_logits(model, tokens, attention_mask=None, position_ids=None) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids,
                     use_cache=False).logits.float()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def _probe_bidirectional(model, vocab: int) -> str | None:
    """None when changing the last token changes the first position's logits, else why not."""
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, vocab, (1, 12), generator=gen)
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % vocab
    a, b = hf_logits(model, tokens), hf_logits(model, changed)
    if torch.allclose(a[0, :-1], b[0, :-1]):
        return (f"transformers {transformers.__version__} ignores is_causal=False (attention is still "
                f"causal), so it cannot serve as a bidirectional oracle")
    return None


# --- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    return {
        "llada-temp": make_temp_checkpoint(root / "llada", "llada", seed=1),
        "dream-temp": make_temp_checkpoint(root / "dream", "dream", seed=2),
    }


_cache: dict = {}


@pytest.fixture(params=[(case, impl) for case in CASES for impl in ATTN_IMPLS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def pair(request, checkpoints):
    """(DiffusionLM, transformers oracle, case name) for a checkpoint and attention implementation."""
    case, impl = request.param
    if case in checkpoints:
        folder = checkpoints[case]
    else:
        require_bundled_weights(case)
        folder = FIXTURES_DIR / case
    key = (str(folder), impl)
    if key not in _cache:
        model = load_model(str(folder), device="cpu", dtype="float32")
        oracle = hf_oracle(folder, impl)
        _cache[key] = (model, oracle, _probe_bidirectional(oracle, model.decodable))
    model, oracle, why_not = _cache[key]
    if why_not:             # transformers>=5 is a test dependency: a broken oracle is a failure
        pytest.fail(why_not)
    return model, oracle, case


def _tokens(model, n: int, t: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.decodable, (n, t), generator=gen)
    tokens[:, 3] = model.mask_id          # a few masked positions, as during decoding
    tokens[:, -4:] = model.mask_id
    return tokens


# --- tests ----------------------------------------------------------------------------------------

def test_is_causal_flag_is_known():
    """The oracle relies on transformers' config-level is_causal switch (transformers >= 5)."""
    from transformers import masking_utils

    src = Path(masking_utils.__file__).read_text()
    assert '"is_causal"' in src or "'is_causal'" in src, (
        f"transformers {transformers.__version__} has no config-level is_causal in masking_utils: "
        "no bidirectional Llama/Qwen2 oracle (the [test] extra needs transformers>=5)")
    cfg = transformers.LlamaConfig(is_causal=False)
    assert cfg.is_causal is False


def test_oracle_is_bidirectional_and_so_is_ours(pair):
    model, oracle, _ = pair
    tokens = _tokens(model, 1, 16, seed=3)
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 7) % model.decodable
    pos = torch.arange(16)
    # transformers: the first position sees the last token.
    assert not torch.allclose(hf_logits(oracle, tokens)[0, 0], hf_logits(oracle, changed)[0, 0])
    # ours: so does the first predicted position (1 for Dream: output 0).
    ours_a, ours_b = model.logits(tokens, pos), model.logits(changed, pos)
    assert not torch.allclose(ours_a[0, 1, :model.decodable], ours_b[0, 1, :model.decodable])


def test_logits_match_oracle(pair):
    model, oracle, case = pair
    t = 20
    tokens = _tokens(model, 2, t, seed=4)
    pos = torch.arange(t)
    ours = model.logits(tokens, pos)
    ref = hf_logits(oracle, tokens)
    assert ours.shape == (2, t, model.vocab_size) and ours.dtype == torch.float32
    v = model.decodable
    if model.logit_shift:
        # Dream: row i predicts position i from output i-1; position 0 reads output 0 (upstream).
        expected = torch.cat([ref[:, :1], ref[:, :-1]], dim=1)
        assert torch.isneginf(ours[..., v:]).all()
        assert v < model.vocab_size          # Dream's head is wider than its tokenizer
    else:
        expected = ref
    err = rel_err(ours[..., :v], expected[..., :v])
    print(f"\n[oracle] {case}: max relative error {err:.2e}")
    assert err < REL_TOL, f"{case}: relative error {err:.2e} >= {REL_TOL}"
    # And without the shift Dream would not match: the shift is real, not a no-op.
    if model.logit_shift:
        assert rel_err(ours[:, 1:, :v], ref[:, 1:, :v]) > 1e-2


def test_positions_subset_matches_oracle(pair):
    """Requesting a few positions (unsorted) gives the oracle's rows for exactly those positions."""
    model, oracle, case = pair
    t = 20
    tokens = _tokens(model, 2, t, seed=6)
    pos = torch.tensor([17, 4, 9, 1])
    ours = model.logits(tokens, pos)
    ref = hf_logits(oracle, tokens)[:, pos - model.logit_shift]
    v = model.decodable
    assert rel_err(ours[..., :v], ref[..., :v]) < REL_TOL


def test_left_padded_batch_matches_oracle(pair):
    model, oracle, case = pair
    t, lengths = 20, (20, 15, 11)
    base = _tokens(model, len(lengths), t, seed=7)
    tokens = torch.full((len(lengths), t), model.pad_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for r, n in enumerate(lengths):
        tokens[r, t - n:] = base[r, :n]
        mask[r, t - n:] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    pos = torch.arange(t)
    ours = model.logits(tokens, pos, attention_mask=mask)
    ref = hf_logits(oracle, tokens, attention_mask=mask, position_ids=position_ids)
    v, s = model.decodable, model.logit_shift
    worst = 0.0
    for r, n in enumerate(lengths):
        first = t - n + s        # first position whose source output is a real token
        worst = max(worst, rel_err(ours[r, first:, :v], ref[r, first - s:t - s, :v]))
        # Padding is invisible: the padded row equals the same sequence alone, unpadded.
        alone = model.logits(base[r:r + 1, :n], torch.arange(s, n))
        assert rel_err(ours[r, first:, :v], alone[0, :, :v]) < REL_TOL
    print(f"\n[oracle] {case} left-padded: max relative error {worst:.2e}")
    assert worst < REL_TOL

    # Changing what sits under the padding changes nothing at real positions.
    junk = tokens.clone()
    junk[mask == 0] = model.mask_id
    ours_junk = model.logits(junk, pos, attention_mask=mask)
    for r, n in enumerate(lengths):
        first = t - n + s
        assert torch.allclose(ours_junk[r, first:], ours[r, first:], atol=1e-5, rtol=1e-5)
