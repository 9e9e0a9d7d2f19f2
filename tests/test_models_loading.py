"""Checkpoint loading: special ids, dtypes, shards, error messages, weight names, chat templates.

Runs on random temporary checkpoints written with ``save_checkpoint`` in both formats (the bundled
fixtures' tokenizer files copied next to them) and on the bundled ``tiny-llada`` / ``tiny-dream``
fixtures once their weights exist.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pvf_lmeval.models import DiffusionLM, load_model
from pvf_lmeval.models.formats import DREAM, FORMATS, LLADA
from pvf_lmeval.models.loader import FIXTURES_DIR, load_tokenizer
from pvf_lmeval.models.transformer import BidirectionalTransformer, TransformerConfig
from helpers.edited_folders import DROP, edited_copy, strip_added_token
from helpers.prerequisites import require_bundled_weights
from test_models_oracle import make_temp_checkpoint

EXPECTED = {
    # family: (mask token, tokens that must all be in eos_ids, pad token)
    "llada": ("<|mdm_mask|>", ("<|endoftext|>", "<|eot_id|>"), "<|endoftext|>"),
    "dream": ("<|mask|>", ("<|endoftext|>", "<|im_end|>"), "<|endoftext|>"),
}


# These nets are tiny: one intra-op thread is faster than two on a shared, busy CPU.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def temp(tmp_path_factory):
    root = tmp_path_factory.mktemp("loading")
    return {family: make_temp_checkpoint(root / family, family, seed=10 + i)
            for i, family in enumerate(("llada", "dream"))}


@pytest.fixture(scope="module")
def tokenizers():
    return {family: load_tokenizer(FIXTURES_DIR / f"tiny-{family}") for family in ("llada", "dream")}


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg, f"error message is not one line: {msg!r}"
    return msg


def _check_special_ids(model: DiffusionLM, family: str) -> None:
    tok = model.tokenizer
    vocab = tok.get_vocab()
    mask, eos, pad = EXPECTED[family]
    assert model.family == family
    assert model.mask_id == vocab[mask]
    assert tok.convert_ids_to_tokens(model.mask_id) == mask
    for name in eos:
        assert vocab[name] in model.eos_ids, (name, model.eos_ids)
    assert model.mask_id not in model.eos_ids
    assert model.pad_id == vocab[pad] and model.pad_id != model.mask_id
    assert model.decodable == len(tok)


def _check_head(model: DiffusionLM, family: str) -> None:
    n_tok = len(model.tokenizer)
    if family == "llada":
        assert model.vocab_size == n_tok == model.decodable
        return
    # Dream: the head is wider than the tokenizer; undecodable ids are -inf and never chosen.
    assert model.vocab_size > n_tok and model.decodable == n_tok
    tokens = torch.randint(0, n_tok, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = model.logits(tokens, torch.arange(12))
    assert logits.shape[-1] == model.vocab_size
    assert torch.isneginf(logits[..., n_tok:]).all()
    assert torch.isfinite(logits[..., :n_tok]).all()
    assert (logits.argmax(-1) < n_tok).all()
    probs = logits.softmax(-1)
    assert (probs[..., n_tok:] == 0).all()
    assert (torch.multinomial(probs.reshape(-1, model.vocab_size), 50, replacement=True) < n_tok).all()


# --- loading and special ids -------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llada", "dream"])
def test_temp_checkpoint_loads(temp, family):
    model = load_model(str(temp[family]), device="cpu")
    assert isinstance(model, DiffusionLM)
    assert model.logit_shift == (1 if family == "dream" else 0)
    assert model.device.type == "cpu" and model.dtype == torch.float32
    _check_special_ids(model, family)
    _check_head(model, family)
    # The loaded weights are the saved ones, bit for bit.
    from safetensors.torch import load_file
    fmt = LLADA if family == "llada" else DREAM
    saved = load_file(str(temp[family] / "model.safetensors"))
    state = model.net.state_dict()
    assert set(state) == {fmt.to_native(k) for k in saved}
    for k, v in saved.items():
        assert torch.equal(state[fmt.to_native(k)], v)


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream"])
def test_bundled_fixture_loads(name):
    require_bundled_weights(name)
    family = name.split("-")[1]
    model = load_model(name, device="cpu")
    assert model.name == name
    assert model.dtype == torch.float32
    _check_special_ids(model, family)
    _check_head(model, family)
    config = json.loads((FIXTURES_DIR / name / "config.json").read_text())
    assert config["model_type"] == ("llada" if family == "llada" else "Dream")
    assert config["mask_token_id"] == model.mask_id


# --- dtype and device ---------------------------------------------------------------------------------

def test_dtype_auto_is_float32_on_cpu(temp):
    assert load_model(str(temp["llada"]), device="cpu", dtype="auto").dtype == torch.float32
    if not torch.cuda.is_available():
        assert load_model(str(temp["llada"])).dtype == torch.float32   # device=None -> cpu here


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_dtype_bfloat16(temp, family):
    f32 = load_model(str(temp[family]), device="cpu", dtype="float32")
    bf16 = load_model(str(temp[family]), device="cpu", dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in bf16.net.parameters())
    tokens = torch.randint(0, f32.decodable, (2, 16), generator=torch.Generator().manual_seed(1))
    a = f32.logits(tokens, torch.arange(16))
    b = bf16.logits(tokens, torch.arange(16))
    assert b.dtype == torch.float32                     # logits are always float32
    v = f32.decodable
    assert torch.isfinite(b[..., :v]).all()
    assert ((a[..., :v] - b[..., :v]).abs().max() / a[..., :v].abs().max()).item() < 0.05


def test_bad_dtype_is_rejected(temp):
    with pytest.raises(ValueError) as exc:
        load_model(str(temp["llada"]), device="cpu", dtype="fp8")
    assert "dtype" in _one_line(exc)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_cuda_without_gpu_names_device(temp):
    with pytest.raises(ValueError) as exc:
        load_model(str(temp["llada"]), device="cuda")
    assert "device" in _one_line(exc)


# --- weights fingerprint --------------------------------------------------------------------------

def test_weights_fingerprint_follows_the_weights_not_the_folder(temp, tmp_path):
    from safetensors.torch import load_file, save_file

    from pvf_lmeval.models.loader import weights_fingerprint

    src = temp["llada"]
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    fp = load_model(str(src), device="cpu").weights_fingerprint
    assert fp.startswith("sha256:") and load_model(str(copy), device="cpu").weights_fingerprint == fp
    # a retrained model: same shape, tokenizer and config, other weights
    tensors = load_file(str(copy / "model.safetensors"))
    save_file({k: v + 1e-3 for k, v in tensors.items()}, str(copy / "model.safetensors"),
              metadata={"format": "pt"})
    assert weights_fingerprint(copy) != fp
    # a large file is sampled at both ends: a change in its last bytes is seen
    small = weights_fingerprint(copy, sample=64)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    assert weights_fingerprint(copy, sample=64) != small
    assert DiffusionLM(BidirectionalTransformer(TransformerConfig(
        vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden=8)),
        mask_id=7, eos_ids=(6,), pad_id=5, logit_shift=0, decodable=8).weights_fingerprint is None


# --- sharded checkpoints --------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llada", "dream"])
def test_sharded_checkpoint_loads_identically(temp, tmp_path, family):
    from safetensors.torch import load_file, save_file

    src = temp[family]
    dst = tmp_path / "sharded"
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(dst / shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in keys})
    (dst / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(t.numel() * 4 for t in tensors.values())}, "weight_map": weight_map}))
    assert not (dst / "model.safetensors").exists()

    single, sharded = load_model(str(src), device="cpu"), load_model(str(dst), device="cpu")
    s1, s2 = single.net.state_dict(), sharded.net.state_dict()
    assert s1.keys() == s2.keys()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert (single.mask_id, single.eos_ids, single.pad_id) == (sharded.mask_id, sharded.eos_ids, sharded.pad_id)
    tokens = torch.randint(0, single.decodable, (1, 10), generator=torch.Generator().manual_seed(2))
    assert torch.equal(single.logits(tokens, torch.arange(10)), sharded.logits(tokens, torch.arange(10)))


# --- errors ---------------------------------------------------------------------------------------

def test_unsupported_model_type_names_model_type(temp, tmp_path):
    folder = tmp_path / "gpt2"
    shutil.copytree(temp["llada"], folder)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2,
         "n_head": 4, "vocab_size": 607}))
    with pytest.raises(ValueError) as exc:
        load_model(str(folder), device="cpu")
    msg = _one_line(exc)
    assert "model_type" in msg and "gpt2" in msg
    for supported in FORMATS:
        assert supported in msg


def test_mask_id_falls_back_to_tokenizer(temp, tmp_path):
    expected = json.loads((temp["llada"] / "config.json").read_text())["mask_token_id"]
    folder = edited_copy(temp["llada"], tmp_path / "no-mask-in-config", mask_token_id=DROP)
    assert load_model(str(folder), device="cpu").mask_id == expected


def test_no_mask_token_anywhere_is_a_clear_error(temp, tmp_path):
    folder = edited_copy(temp["llada"], tmp_path / "no-mask", mask_token_id=DROP)
    strip_added_token(folder, "<|mdm_mask|>")
    tok = load_tokenizer(folder)
    assert "<|mdm_mask|>" not in tok.get_vocab() and tok.mask_token_id is None
    with pytest.raises(ValueError) as exc:
        load_model(str(folder), device="cpu")
    msg = _one_line(exc)
    assert "mask" in msg and "mask_token_id" in msg and "diffusion" in msg


@pytest.mark.parametrize("pretrained", ["/nonexistent/checkpoint/folder", "no-such-model", "a/b/c",
                                        "tiny-gpt"])
def test_pretrained_not_a_folder_or_bundled_name(pretrained):
    with pytest.raises(ValueError) as exc:
        load_model(pretrained, device="cpu")
    msg = _one_line(exc)
    assert "pretrained" in msg and pretrained in msg
    assert "tiny-llada" in msg            # the message lists the bundled names


def test_pretrained_is_a_file(temp):
    with pytest.raises(ValueError) as exc:
        load_model(str(temp["llada"] / "config.json"), device="cpu")
    assert "pretrained" in _one_line(exc)


def test_folder_without_config(tmp_path):
    with pytest.raises(ValueError) as exc:
        load_model(str(tmp_path), device="cpu")
    assert "config.json" in _one_line(exc)


# --- weight names and configs -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [LLADA, DREAM], ids=["llada", "dream"])
def test_weight_names_round_trip(fmt):
    cfg = TransformerConfig(vocab_size=32, d_model=16, n_layers=12, n_heads=2, n_kv_heads=1,
                            ffn_hidden=24, qkv_bias=True)
    with torch.device("meta"):
        net = BidirectionalTransformer(cfg)
    natives = list(net.state_dict())
    ckpt = [fmt.from_native(n) for n in natives]
    assert len(set(ckpt)) == len(ckpt)                      # no two parameters share a name
    for native, name in zip(natives, ckpt):
        assert fmt.to_native(name) == native
        assert fmt.from_native(fmt.to_native(name)) == name
    assert fmt.to_native("model.something.else") is None
    with pytest.raises(KeyError):
        fmt.from_native("blocks.0.attn.rotary.weight")


def test_weight_names_match_the_real_checkpoints():
    llada = {
        "embed.weight": "model.transformer.wte.weight",
        "blocks.11.attn_norm.weight": "model.transformer.blocks.11.attn_norm.weight",
        "blocks.3.attn.o_proj.weight": "model.transformer.blocks.3.attn_out.weight",
        "blocks.3.mlp_norm.weight": "model.transformer.blocks.3.ff_norm.weight",
        "blocks.3.mlp.gate_proj.weight": "model.transformer.blocks.3.ff_proj.weight",
        "blocks.3.mlp.up_proj.weight": "model.transformer.blocks.3.up_proj.weight",
        "blocks.3.mlp.down_proj.weight": "model.transformer.blocks.3.ff_out.weight",
        "norm.weight": "model.transformer.ln_f.weight",
        "lm_head.weight": "model.transformer.ff_out.weight",
    }
    dream = {
        "embed.weight": "model.embed_tokens.weight",
        "blocks.27.attn_norm.weight": "model.layers.27.input_layernorm.weight",
        "blocks.0.attn.k_proj.bias": "model.layers.0.self_attn.k_proj.bias",
        "blocks.0.attn.o_proj.weight": "model.layers.0.self_attn.o_proj.weight",
        "blocks.0.mlp_norm.weight": "model.layers.0.post_attention_layernorm.weight",
        "blocks.0.mlp.down_proj.weight": "model.layers.0.mlp.down_proj.weight",
        "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    for fmt, table in ((LLADA, llada), (DREAM, dream)):
        for native, name in table.items():
            assert fmt.from_native(native) == name
            assert fmt.to_native(name) == native


@pytest.mark.parametrize("fmt", [LLADA, DREAM], ids=["llada", "dream"])
def test_config_round_trip(fmt):
    cfg = TransformerConfig(vocab_size=640, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2,
                            ffn_hidden=96, norm_eps=1e-6, rope_theta=123456.0,
                            qkv_bias=fmt is DREAM, max_seq_len=300)
    written = fmt.write_config(cfg, {"mask_token_id": 5})
    assert written["model_type"] == fmt.model_type and written["mask_token_id"] == 5
    assert fmt.read_config(json.loads(json.dumps(written))) == cfg


# --- positions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llada", "dream"])
def test_per_row_positions_equal_shared_positions(temp, family):
    model = load_model(str(temp[family]), device="cpu")
    tokens = torch.randint(0, model.decodable, (3, 14), generator=torch.Generator().manual_seed(3))
    shared = torch.tensor([0, 1, 5, 13, 7])          # unsorted, with both ends of the canvas
    a = model.logits(tokens, shared)
    b = model.logits(tokens, shared.expand(3, -1).clone())
    assert a.shape == b.shape == (3, 5, model.vocab_size)
    assert torch.equal(a, b)
    # Different positions per row equal each row's own shared-form call.
    per_row = torch.tensor([[2, 3, 4], [13, 0, 6], [9, 9, 1]])
    c = model.logits(tokens, per_row)
    for r in range(3):
        assert torch.equal(c[r], model.logits(tokens, per_row[r])[r])
    # Position 0 (Dream: no left neighbour) reads output 0, not the last row.
    full = model.logits(tokens, torch.arange(14))
    if family == "dream":
        assert torch.equal(full[:, 0], full[:, 1])
        with torch.no_grad():
            last = model.net(tokens)[:, -1].float()
        assert not torch.allclose(full[:, 0, :model.decodable], last[:, :model.decodable])


# --- chat templates -------------------------------------------------------------------------------

def test_llada_chat_template(tokenizers):
    tok = tokenizers["llada"]
    one = tok.apply_chat_template([{"role": "user", "content": "  What is 2 + 3?\n"}],
                                  tokenize=False, add_generation_prompt=True)
    assert one == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    two = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "5"},
         {"role": "user", "content": "again"}], tokenize=False, add_generation_prompt=True)
    assert two == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n5<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    # Special tokens encode as single ids; no second bos is added (add_bos_token false).
    ids = tok(one, add_special_tokens=True)["input_ids"]
    vocab = tok.get_vocab()
    assert ids[0] == vocab["<|startoftext|>"] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids[1] == vocab["<|start_header_id|>"]
    assert ids.count(vocab["<|eot_id|>"]) == 1
    assert tok.decode(ids) == one


def test_dream_chat_template(tokenizers):
    tok = tokenizers["dream"]
    one = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                  tokenize=False, add_generation_prompt=True)
    assert one == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                   "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    own_system = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        tokenize=False, add_generation_prompt=True)
    assert own_system == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                          "<|im_start|>assistant\n")
    ids = tok(one)["input_ids"]
    vocab = tok.get_vocab()
    assert ids[0] == vocab["<|im_start|>"]                    # no bos in front
    assert ids.count(vocab["<|im_start|>"]) == 3 and ids.count(vocab["<|im_end|>"]) == 2
    assert tok.decode(ids) == one
