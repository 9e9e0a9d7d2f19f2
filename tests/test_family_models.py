"""The families beyond LLaDA, Dream and the LLaDA MoEs: SDAR / TraDo, SDAR-MoE, RND1, Fast-dLLM v2
and MMaDA's text model, loaded from hub-shaped folders built from their published configs
(``helpers/qwen_folders.py``, ``helpers/hub_folders.py``): every weight in its slot, each config
read as its reference reads it (block size, logit shift, special ids, routing), recognition by
``model_type`` or ``architectures``, one-line refusals, the folder's own chat template.

Logit equality with each family's published modeling code is checked outside the repository
(docs/models.md gives the numbers); here the mapping and the reading are pinned."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.edited_folders import DROP, edited_copy
from helpers.hub_folders import make_mmada_folder
from helpers.qwen_folders import (QWEN_CHAT_TEMPLATE, make_fast_dllm_folder, make_rnd1_folder,
                                  make_sdar_folder)
from safetensors import safe_open

from pvf_lmeval.models import load_model
from pvf_lmeval.models.formats import UnsupportedCheckpoint, format_for
from pvf_lmeval.models.moe import MoEConfig, RoutedExperts, route
from pvf_lmeval.models.transformer import MLP

pytestmark = pytest.mark.usefixtures("one_thread")

BUILDERS = {
    "sdar": make_sdar_folder,
    "sdar_moe": lambda folder, seed: make_sdar_folder(folder, seed, moe=True,
                                                      mlp_only_layers=[0]),
    "rnd1": make_rnd1_folder,
    "fast_dllm": make_fast_dllm_folder,
    "mmada": make_mmada_folder,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: make(root / name, seed=i) for i, (name, make) in enumerate(BUILDERS.items())}


@pytest.fixture(scope="module")
def models(folders):
    return {name: load_model(str(f), device="cpu", dtype="float32") for name, f in folders.items()}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_checkpoint_tensor_lands_in_its_native_slot(folders, models, name):
    folder = folders[name]
    fmt = format_for(json.loads((folder / "config.json").read_text()))
    state = models[name].net.state_dict()
    filled = set()
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                native, expert = fmt.slot(key)
                got = state[native] if expert is None else state[native][expert]
                assert torch.equal(got, f.get_tensor(key).float()), key
                filled.add(native)
    assert filled == set(state)                  # nothing native left at its init value


def test_sdar_reads_its_config(models):
    m = models["sdar"]
    assert (m.family, m.block_size, m.logit_shift, m.mask_id) == ("sdar", 4, 0, 151669)
    assert m.eos_ids == (151643, 151645)         # config's <|endoftext|>, the chat's <|im_end|>
    c = m.net.cfg
    assert (c.head_dim, c.qk_norm, c.qkv_bias, c.moe) == (16, True, False, None)   # 16 != 32 / 4


def test_sdar_moe_routes_by_qwen3_moes_rule(models):
    m = models["sdar_moe"]
    assert m.block_size == 4 and m.logit_shift == 0
    assert [type(b.mlp) for b in m.net.blocks] == [MLP, RoutedExperts]   # mlp_only_layers [0]
    moe = m.net.cfg.moe
    assert (moe.score, moe.normalize, moe.normalize_single, moe.shared_hidden) == \
        ("softmax", True, True, 0)


def test_rnd1_is_bidirectional_shifted_and_always_renormalised(folders, models):
    m = models["rnd1"]
    assert (m.family, m.block_size, m.logit_shift, m.mask_id) == ("rnd1", None, 1, 151669)
    assert [type(b.mlp) for b in m.net.blocks] == [RoutedExperts, RoutedExperts]
    # RND1's config class overwrites the routing keys with its released values: a config.json
    # saying otherwise is read as the reference reads it
    cfg = json.loads((folders["rnd1"] / "config.json").read_text())
    cfg.update(norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[0])
    moe = format_for(cfg).read_config(cfg).moe
    assert moe.normalize and moe.all_routed


def test_rnd1_mask_is_its_config_class_default_when_absent(folders, tmp_path):
    folder = edited_copy(folders["rnd1"], tmp_path / "rnd1", mask_token_id=DROP)
    assert load_model(str(folder), device="cpu", dtype="float32").mask_id == 151669


def test_fast_dllm_reads_bd_size_shift_and_the_tokenizers_mask(models):
    m = models["fast_dllm"]
    assert (m.family, m.block_size, m.logit_shift) == ("fast-dllm", 32, 1)
    assert m.mask_id == 151665                   # |<MASK>|: its config.json names no mask id
    assert m.tokenizer.convert_ids_to_tokens(m.mask_id) == "|<MASK>|"
    assert m.eos_ids == (151645,) and m.pad_id == 151645
    assert m.net.cfg.qkv_bias and not m.net.cfg.o_bias


def test_mmada_is_llada_under_its_own_model_type(models):
    m = models["mmada"]
    assert m.family == "llada" and m.block_size is None and m.logit_shift == 0


@pytest.mark.parametrize("name", ["sdar", "fast_dllm"])
def test_chat_template_comes_from_the_folders_jinja_file(models, name):
    tok = models[name].tokenizer
    assert tok.chat_template == QWEN_CHAT_TEMPLATE
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("architecture,model_type", [
    ("SDARForCausalLM", "sdar"), ("SDARMoeForCausalLM", "sdar_moe"), ("RND1LM", "rnd1"),
    ("Fast_dLLM_QwenForCausalLM", "Fast_dLLM_Qwen"), ("MMadaModelLM", "mmada"),
    ("LLaDAModelLM", "llada"), ("DreamModel", "Dream"),
])
def test_an_unknown_model_type_is_recognised_by_its_architecture(architecture, model_type):
    cfg = {"model_type": "my_finetune", "architectures": ["Other", architecture]}
    assert format_for(cfg).model_type == model_type


def test_an_unsupported_model_type_is_one_line_listing_the_supported_ones():
    with pytest.raises(UnsupportedCheckpoint) as ei:
        format_for({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("model_type='qwen2' in config.json is not a supported")
    assert "sdar, sdar_moe, Fast_dLLM_Qwen, rnd1" in msg


def test_a_diffusion_gemma_config_lacking_its_expert_keys_is_one_line(tmp_path):
    """A third-party fixture of google/diffusiongemma-26B-A4B-it's config.json that names its
    experts with Gemma-4's ``num_experts_per_tok`` (DiffusionGemma's key is ``top_k_experts``:
    ``tests/test_diffusion_gemma.py`` loads the published keys)."""
    folder = tmp_path / "diffusiongemma"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
        "canvas_length": 256, "tie_word_embeddings": True,
        "text_config": {"model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 2816,
                        "num_hidden_layers": 30, "num_experts": 128, "num_experts_per_tok": 8}}))
    with pytest.raises(ValueError) as ei:
        load_model(str(folder), device="cpu")
    msg = str(ei.value)
    assert "\n" not in msg and "text_config.top_k_experts is absent" in msg


@pytest.mark.parametrize("name,change,says", [
    ("sdar", {"block_size": 0}, "block_size=0; a SDAR checkpoint needs it as a positive integer"),
    ("sdar", {"rope_scaling": {"type": "yarn"}}, "rope_scaling="),
    ("sdar_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step=0; a SDAR-MoE checkpoint"),
    ("sdar_moe", {"mlp_only_layers": "0"}, "mlp_only_layers=\"0\"; a SDAR-MoE checkpoint needs a list"),
    ("fast_dllm", {"bd_size": "32"}, "bd_size=\"32\"; a Fast-dLLM v2 checkpoint needs it"),
    ("rnd1", {"num_experts": None}, "num_experts is null; a RND1 checkpoint needs it"),
    # a per-layer table of 10**9 entries is never built: refused before, in one line
    ("sdar_moe", {"num_hidden_layers": 10**9, "decoder_sparse_step": 2},
     "num_hidden_layers=1000000000 with dense layers (decoder_sparse_step, mlp_only_layers); a "
     "SDAR-MoE checkpoint has at most 65536"),
])
def test_unsupported_config_is_one_line(folders, name, change, says):
    cfg = json.loads((folders[name] / "config.json").read_text())
    cfg.update(change)
    with pytest.raises(UnsupportedCheckpoint) as ei:
        format_for(cfg).read_config(cfg)         # what load_model raises, before any weight
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_qwen3_moe_routing_by_hand():
    """softmax over 4 experts, the best 2 divided by their sum; a single best divided by itself
    (weight 1), which LLaDA 2.x's rule leaves as its score."""
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    two = MoEConfig(n_experts=4, top_k=2, expert_hidden=1, normalize=True, normalize_single=True)
    idx, w = route(logits, two)
    assert idx.tolist() == [[1, 3]] and torch.allclose(w, torch.tensor([[4 / 7, 3 / 7]]))
    one = MoEConfig(n_experts=4, top_k=1, expert_hidden=1, normalize=True, normalize_single=True)
    assert route(logits, one)[1].tolist() == [[1.0]]
    llada2_like = MoEConfig(n_experts=4, top_k=1, expert_hidden=1, normalize=True)
    assert torch.allclose(route(logits, llada2_like)[1], torch.tensor([[0.4]]))
