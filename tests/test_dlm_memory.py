"""``pvf-dlm memory``: weights and KV cache per rank from config.json and the safetensors headers.

A LLaDA2.0-flash-shaped folder (the published config: 32 layers, the first dense, hidden 4096,
32 query / 4 key-value heads of 128, 256 routed experts of 1024, one shared expert, vocabulary
157,184) whose files are headers over holes: the figures come from the headers only, and must
equal the hand arithmetic below on the published shapes.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.gemma_folders import PUBLISHED, gemma_config, gemma_weights
from helpers.header_folders import shapes_of, write_header_files
from helpers.moe_folders import llada2_config, llada2_weights

from pvf_lmeval.cli import dlm
from pvf_lmeval.models.footprint import footprint

#: the published LLaDA2.0-flash config.json values (inclusionAI/dFactory,
#: configs/model_configs/llada2_flash/config.json) that shape the weights
FLASH = dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=9216,
             first_k_dense_replace=1, moe_intermediate_size=1024, num_experts_per_tok=8,
             num_attention_heads=32, num_experts=256, num_key_value_heads=4, head_dim=128,
             num_shared_experts=1, n_group=8, topk_group=4, rotary_dim=64)
V, D, L, E, F, FD, H, KV, HD = 157184, 4096, 32, 256, 1024, 9216, 32, 4, 128


@pytest.fixture(scope="module")
def flash(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flash")
    cfg = llada2_config(V, {"mask_token_id": 156895, "eos_token_id": 156892,
                            "pad_token_id": 156892}, **FLASH)
    (folder / "config.json").write_text(json.dumps(cfg))
    total = write_header_files(folder, shapes_of(llada2_weights, cfg))
    assert total > 200e9                          # the whole checkpoint's bytes, never written
    return folder


_FOOTPRINTS: dict = {}


def _footprint(folder, n: int, layers: str):
    """``footprint`` of the flash folder at 16 requests of 4096 tokens (each layout once)."""
    if (n, layers) not in _FOOTPRINTS:
        _FOOTPRINTS[n, layers] = footprint(folder, n, layers, torch.bfloat16, batch_size=16,
                                           tokens=4096)
    return _FOOTPRINTS[n, layers]


def _by_hand(n: int, attention_split: bool, split: bool) -> tuple[int, int]:
    """(routed expert bytes, other weight bytes) per rank, bfloat16, from the published shapes."""
    experts = (L - 1) * (E // n) * 3 * D * F * 2
    attention = (H + 2 * KV) * HD * D + D * H * HD                 # qkv and the output
    per_layer = 2 * D + 2 * HD + (attention // n if attention_split else attention)
    dense = 3 * D * FD // (n if split else 1)
    shared = 3 * D * F // (n if split else 1)
    routed_rest = E * D + E + shared                               # router, bias, shared
    other = (V * D + V * D // (n if split else 1) + D + L * per_layer + dense
             + (L - 1) * routed_rest)
    return experts, other * 2


@pytest.mark.parametrize("n,layers,attention_split", [
    (8, "all", False), (8, "experts", False), (4, "all", True), (1, "all", True)])
def test_weights_per_rank_from_the_headers(flash, n, layers, attention_split):
    fp = _footprint(flash, n, layers)
    experts, other = _by_hand(n, attention_split, layers == "all" and n > 1)
    assert (fp.experts, fp.other) == (experts, other)
    kv_heads = KV // n if attention_split else KV
    assert fp.kv_cache == L * 2 * kv_heads * HD * 4096 * 16 * 2
    assert fp.whole == sum(_by_hand(1, True, False))


def test_flash_at_8_ranks_fits_in_32_gb_per_rank(flash):
    for layers in ("all", "experts"):
        assert _footprint(flash, 8, layers).weights <= 32e9


def test_the_command_prints_the_table(flash, capsys):
    assert dlm.main(["memory", f"pretrained={flash},tp_size=8,batch_size=16,gen_length=1024,"
                               "prompt_length=256"]) == 0
    out = capsys.readouterr()
    experts, other = _by_hand(8, False, True)
    kv = L * 2 * KV * HD * 1280 * 16 * 2
    lines = out.out.splitlines()
    assert lines[1] == ("note: attention is replicated on each of the 8 ranks: its 4 key/value "
                        "heads do not split over 8")
    assert lines[3].split() == ["routed", "experts", f"{experts / 1e9:.2f}", str(experts)]
    assert lines[5].split() == ["weights", f"{(experts + other) / 1e9:.2f}",
                                str(experts + other)]
    assert lines[6].split() == ["KV", "cache", f"{kv / 1e9:.2f}", str(kv)]
    assert "batch_size=16 x 1280 tokens (prompt_length 256 + gen_length 1024)" in out.out


@pytest.mark.parametrize("spec,says", [
    ("pretrained={f},tensor_parallel_size=3", "tensor_parallel_size=3 must divide the model's "
                                              "256 routed experts"),
    ("pretrained={f},tp_size=2,offload_folder=x", "'offload_folder=x': expected key=value with "
                                                  "a key among"),
    ("pretrained={f},batch_size=0", "batch_size='0' must be a positive integer"),
    ("pretrained={f},dtype=int8", "dtype='int8' must be one of auto, bfloat16"),
    ("pretrained=/no/such/folder", "not a checkpoint folder with a config.json"),
    ("tensor_parallel_size=2", "pretrained=PATH is required"),
])
def test_bad_arguments_are_one_line(flash, capsys, spec, says):
    assert dlm.main(["memory", spec.format(f=flash)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("pvf-dlm memory: ")
    assert len(out.err.splitlines()) == 1 and says in out.err, out.err


# --- DiffusionGemma 26B-A4B ---------------------------------------------------------------------

#: google/diffusiongemma-26B-A4B-it's published text_config (helpers.gemma_folders.PUBLISHED):
#: vocabulary, width, layers (25 sliding-window, 5 global), routed experts of GF, dense MLP of
#: GFF, query heads; sliding layers 8 key/value heads of 256, global ones 2 of 512 without a
#: value projection
GV, GD, GL, GE, GF, GFF, GH = 262144, 2816, 30, 128, 704, 2112, 16
SLIDING, GLOBAL = (25, 8, 256), (5, 2, 512)


@pytest.fixture(scope="module")
def gemma26b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma26b")
    cfg = gemma_config(vocab=GV, canvas_length=256, **PUBLISHED)
    (folder / "config.json").write_text(json.dumps(cfg))
    write_header_files(folder, shapes_of(gemma_weights, cfg))
    return folder


def _gemma_by_hand(n: int) -> tuple[int, int]:
    """(routed expert bytes, other weight bytes) per rank at expert parallel ``n``, bfloat16:
    only the experts split; the vision tower's tensors are not the text network's."""
    experts = GL * (GE // n) * 3 * GF * GD * 2              # stacked gate+up (2F) and down (F)
    attention = sum(layers * (GH * hd * GD + kv * hd * GD * (2 if value else 1) + GD * GH * hd
                              + 2 * hd)                       # q, k, (v), o, q/k norms
                    for (layers, kv, hd), value in ((SLIDING, True), (GLOBAL, False)))
    per_layer = (7 * GD + 3 * GD * GFF                       # seven norms, the dense MLP
                 + GE * GD + GD + GE + 2)                    # router, its scale, per-expert, scalars
    other = GV * GD + GD + attention + GL * per_layer + GD + 3 * GD * GFF   # + final norm, SC
    return experts, other * 2


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_diffusion_gemma_26b_per_rank_at_expert_parallel(gemma26b, n):
    fp = footprint(gemma26b, n, "experts", torch.bfloat16, batch_size=1, tokens=4096)
    assert (fp.experts, fp.other) == _gemma_by_hand(n)
    assert fp.whole == sum(_gemma_by_hand(1))
    keys = SLIDING[0] * SLIDING[1] * SLIDING[2] + GLOBAL[0] * GLOBAL[1] * GLOBAL[2]
    assert fp.kv_cache == 2 * keys * 4096 * 2


def test_diffusion_gemma_26b_replicates_attention_when_all_is_split(gemma26b):
    fp = footprint(gemma26b, 4, "all", torch.bfloat16)
    assert fp.notes == ("attention is replicated on each of the 4 ranks: its global and "
                        "sliding-window layers differ in shape",)
