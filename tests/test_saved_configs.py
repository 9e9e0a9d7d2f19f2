"""Published configuration classes round-trip: a folder whose config.json is exactly what the
family's own class writes (``helpers/saved_configs.py``: its ``save_pretrained`` run outside the
repository) loads, and reads as the published config.json does (the same logits from the same
weights).

RND1's class writes ``rope_scaling: false`` and ``sliding_window: false`` and forces every size
to RND1-Base's (30B parameters): that exact file is checked against headers of its published
shapes (no weight written), and loaded at small sizes with every other value as written. The
classes whose own code raises on ``rope_scaling: false`` (``rope_config_validation`` in SDAR's,
Dream's, LLaDA-MoE's, Fast-dLLM v2's; LLaDA 2.x's rotary calls ``.get`` on it) are refused it."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import saved_configs
from helpers.edited_folders import edited_copy
from helpers.header_folders import shapes_of, write_header_files
from helpers.hub_folders import make_dream_folder, make_llada_folder, make_mmada_folder
from helpers.moe_folders import make_llada2_folder, make_lladamoe_folder
from helpers.qwen_folders import (make_fast_dllm_folder, make_rnd1_folder, make_sdar_folder,
                                  qwen3_weights, rnd1_config)

from pvf_lmeval.cli import dlm
from pvf_lmeval.models.footprint import footprint
from pvf_lmeval.models.formats import UnsupportedCheckpoint
from pvf_lmeval.models.loader import load_model, read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

#: family -> (its folder builder at the published config, the config.json its class saves)
SAVED = {
    "llada": (make_llada_folder, saved_configs.LLADA),
    "mmada": (make_mmada_folder, saved_configs.MMADA),
    "dream": (make_dream_folder, saved_configs.DREAM),
    "lladamoe": (make_lladamoe_folder, saved_configs.LLADA_MOE),
    "llada2": (make_llada2_folder, saved_configs.LLADA2),
    "sdar": (make_sdar_folder, saved_configs.SDAR),
}
#: the sizes RND1's class forces (its CONFIG_DEFAULTS), as the small folders hold them
RND1_SIZES = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
              "num_experts", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads",
              "head_dim")


def _logits(model) -> torch.Tensor:
    x = torch.tensor([[3, 17, 101, 250, model.mask_id, model.mask_id, model.mask_id, 9]])
    return model.logits(x, torch.arange(x.shape[1]))


def _as_saved(folder, config: dict):
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.mark.parametrize("family", list(SAVED))
def test_a_folder_as_its_config_class_saves_it_loads_as_published(tmp_path, family):
    make, saved = SAVED[family]
    published = load_model(str(make(tmp_path / "published", seed=5)), device="cpu",
                           dtype="float32")
    folder = _as_saved(make(tmp_path / "saved", seed=5), saved)
    model = load_model(str(folder), device="cpu", dtype="float32")
    assert torch.equal(_logits(model), _logits(published))


def test_rnd1_as_its_config_class_saves_it_loads_at_small_sizes(tmp_path):
    """rope_scaling false (RND1's rotary is transformers' Qwen3-MoE one, which reads anything
    but a dict as no scaling) and sliding_window false (stored, never read by its attention)."""
    assert saved_configs.RND1["rope_scaling"] is False
    assert saved_configs.RND1["sliding_window"] is False
    published = load_model(str(make_rnd1_folder(tmp_path / "published", seed=5)), device="cpu",
                           dtype="float32")
    small = rnd1_config()
    folder = _as_saved(make_rnd1_folder(tmp_path / "saved", seed=5),
                       {**saved_configs.RND1, **{k: small[k] for k in RND1_SIZES}})
    model = load_model(str(folder), device="cpu", dtype="float32")
    assert torch.equal(_logits(model), _logits(published))


@pytest.fixture(scope="module")
def rnd1_base(tmp_path_factory):
    """RND1's saved config.json exactly, over safetensors headers of the shapes it implies."""
    folder = tmp_path_factory.mktemp("rnd1-base")
    _as_saved(folder, saved_configs.RND1)
    write_header_files(folder, shapes_of(qwen3_weights, saved_configs.RND1))
    return folder


def test_rnd1_as_its_config_class_saves_it_passes_the_loaders_checks(rnd1_base):
    """RND1-Base-0910's published shapes, by hand: 48 layers of hidden 2048, 32 query and 4
    key/value heads of 128, 128 experts of 768, untied 151,936-token embeddings (30.5B
    parameters)."""
    config, fmt, cfg, _ = read_checkpoint(rnd1_base)
    assert config == saved_configs.RND1 and fmt.model_type == "rnd1"
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == \
        (48, 2048, 32, 4, 128)
    v, d, e, f = 151936, 2048, 128, 768
    layer = 2 * d + 32 * 128 * d + 2 * 4 * 128 * d + d * 32 * 128 + 2 * 128 + e * d + e * 3 * f * d
    params = 2 * v * d + d + 48 * layer
    assert params == 30_532_122_624
    assert footprint(rnd1_base).whole == 2 * params


def test_rnd1_as_saved_prints_its_memory_table(rnd1_base, capsys):
    assert dlm.main(["memory", f"pretrained={rnd1_base},tp_size=8,parallel_layers=experts"]) == 0
    assert capsys.readouterr().out.startswith(f"pvf-dlm memory: {rnd1_base} (rnd1), "
                                              "tensor_parallel_size=8, parallel_layers=experts")


@pytest.fixture(scope="module")
def refusing(tmp_path_factory):
    root = tmp_path_factory.mktemp("false")
    return {"sdar": make_sdar_folder(root / "sdar"), "dream": make_dream_folder(root / "dream"),
            "lladamoe": make_lladamoe_folder(root / "lladamoe"),
            "llada2": make_llada2_folder(root / "llada2"),
            "fast_dllm": make_fast_dllm_folder(root / "fast_dllm")}


@pytest.mark.parametrize("family", ["sdar", "dream", "lladamoe", "llada2", "fast_dllm"])
def test_rope_scaling_false_is_refused_where_the_familys_own_code_raises_on_it(
        refusing, tmp_path, family):
    folder = edited_copy(refusing[family], tmp_path / family, rope_scaling=False)
    with pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    assert str(exc.value).endswith("config.json: rope_scaling=false is not supported by the "
                                   "native network; supported: null")


def test_rnd1_refuses_a_rope_scaling_dict(tmp_path):
    folder = make_rnd1_folder(tmp_path / "rnd1", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    assert str(exc.value).endswith("supported: null or false")
