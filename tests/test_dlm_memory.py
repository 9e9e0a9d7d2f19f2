"""``pvf-dlm memory``: weights and KV cache per rank from config.json and the safetensors headers.

A LLaDA2.0-flash-shaped folder (the published config: 32 layers, the first dense, hidden 4096,
32 query / 4 key-value heads of 128, 256 routed experts of 1024, one shared expert, vocabulary
157,184) and a DiffusionGemma-26B-A4B-shaped one whose files are headers over holes: the figures
come from the headers only, and must equal the hand arithmetic below on the published shapes.
DiffusionGemma's KV cache is the context's as transformers' ``DynamicCache`` holds it between
calls (its ``DynamicSlidingWindowLayer`` keeps the last ``sliding_window - 1`` positions of a
sliding-window layer). Hostile folders get the loader's one-line errors.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers.gemma_folders import (PUBLISHED, gemma_config, gemma_weights, make_gemma_folder,
                                   make_saved_gemma_folder)
from helpers.bounds import bounded
from helpers.edited_folders import edit_config
from helpers.header_folders import shapes_of, write_header_files
from helpers.moe_folders import llada2_config, llada2_weights
from helpers.qwen_folders import make_sdar_folder

from pvf_lmeval.cli import dlm
from pvf_lmeval.models.footprint import footprint
from pvf_lmeval.models.loader import FIXTURES_DIR

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
                                           prompt_length=4096)
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
    assert lines[8] == ("KV cache: batch_size=16 x 1280 tokens (prompt_length 256 + gen_length "
                        "1024): every layer's keys and values at every position, as cache=prefix "
                        "or dual hold them; activations are not included")


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
    fp = footprint(gemma26b, n, "experts", torch.bfloat16, batch_size=1, prompt_length=4096)
    assert (fp.experts, fp.other) == _gemma_by_hand(n)
    assert fp.whole == sum(_gemma_by_hand(1))


@pytest.mark.parametrize("tokens,kept", [(4096, 1023), (1024, 1023), (1023, 1023), (512, 512)])
def test_diffusion_gemma_sliding_layers_keep_their_window(gemma26b, tokens, kept):
    """Keys and values, bfloat16, 3 requests: the 5 global layers (2 heads of 512) at every
    position, the 25 sliding-window layers (8 heads of 256) at the last sliding_window - 1 =
    1023 (counted at every position, one request of 4096 tokens gave 0.92 GB where the cache
    holds 0.29 GB)."""
    fp = footprint(gemma26b, 2, "experts", torch.bfloat16, batch_size=3, prompt_length=tokens)
    assert fp.kv_cache == 2 * (5 * 2 * 512 * tokens + 25 * 8 * 256 * kept) * 3 * 2


def test_diffusion_gemma_kv_line_says_what_it_counts(gemma26b, capsys):
    """A long context: a prompt of 4000 and two canvases of 256; cache=prefix keeps the context
    of the last canvas, 4000 + 256 = 4256 positions, on the 5 global layers (2 heads of 512)
    and the last 1023 on the 25 sliding-window layers (8 heads of 256); keys and values,
    bfloat16."""
    assert dlm.main(["memory", f"pretrained={gemma26b},prompt_length=4000,gen_length=512"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kv = 2 * (5 * 2 * 512 * 4256 + 25 * 8 * 256 * 1023) * 2
    assert lines[5].split() == ["KV", "cache", f"{kv / 1e9:.2f}", str(kv)]
    assert lines[7] == (
        "KV cache: batch_size=1 x 4256 tokens (prompt_length 4000 + gen_length 512 - the last "
        "canvas 256): the context's keys and values (the prompt and every canvas but the last) "
        "as cache=prefix keeps them, as transformers' DynamicCache holds them between calls (5 "
        "global layers: every position; 25 sliding-window layers: the last 1023, "
        "sliding_window - 1); activations are not included")


def test_a_diffusion_gemma_gen_length_of_part_of_a_canvas_is_one_line(gemma26b, capsys):
    code, out, err = _memory(f"pretrained={gemma26b},prompt_length=4000,gen_length=96", capsys)
    assert code == 2 and out == ""
    assert err == ("pvf-dlm memory: gen_length=96 must be a multiple of the canvas, "
                   "canvas_length 256 (its decoders denoise whole canvases)\n")


def test_diffusion_gemma_26b_replicates_attention_when_all_is_split(gemma26b):
    fp = footprint(gemma26b, 4, "all", torch.bfloat16)
    assert fp.notes == ("attention is replicated on each of the 4 ranks: its global and "
                        "sliding-window layers differ in shape",)
# --- hostile folders and layouts: the loader's own checks, one line each -------------------------

def _memory(spec: str, capsys) -> tuple[int, str, str]:
    with bounded(seconds=30, extra_bytes=256 << 20):
        code = dlm.main(["memory", spec])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def llada_copy(tmp_path):
    return shutil.copytree(FIXTURES_DIR / "tiny-llada", tmp_path / "tiny-llada")


@pytest.mark.parametrize("size", [385, 10 ** 6, 10 ** 9])
def test_more_ranks_than_the_model_can_split_is_one_line(llada_copy, capsys, size):
    """tiny-llada splits its 384 MLP rows (and 691 vocabulary rows) over at most 384 ranks;
    10**6 ranks ran past a minute, 10**9 raised MemoryError."""
    code, out, err = _memory(f"pretrained={llada_copy},tensor_parallel_size={size}", capsys)
    assert code == 2 and out == ""
    assert err == (f"pvf-dlm memory: tensor_parallel_size={size} is more ranks than the model "
                   f"can split: parallel_layers=all gives each rank rows of the MLP's 384 hidden "
                   f"units (ffn_hidden), so at most 384\n")


def test_as_many_ranks_as_mlp_rows_is_a_table(llada_copy, capsys):
    code, out, err = _memory(f"pretrained={llada_copy},tensor_parallel_size=384", capsys)
    assert code == 0 and err == ""
    assert out.splitlines()[0].endswith("tensor_parallel_size=384, parallel_layers=all, bfloat16")


@pytest.mark.parametrize("changes,says", [
    ({"n_kv_heads": -4}, "n_kv_heads is -4; a LLaDA checkpoint needs it as a positive integer"),
    ({"n_layers": 10 ** 21}, "n_layers is 1000000000000000000000; a LLaDA checkpoint needs it as "
                             "a positive integer below 2^63"),
    ({"n_layers": 10 ** 18}, "n_layers=1000000000000000000 but the weights hold layers 0..3"),
    ({"d_model": "128"}, "d_model is \"128\"; a LLaDA checkpoint needs it as a positive integer"),
    ({"mlp_hidden_size": 385}, "weight 'model.transformer.blocks.0.ff_proj.weight' has shape "
                               "[384, 128], but"),
])
def test_a_config_the_loader_refuses_is_refused_in_one_line(llada_copy, capsys, changes, says):
    """The loader's config and header checks, not a copy: a negative head count printed
    "KV cache -16384 bytes", 10**21 layers 8.2e15 GB."""
    edit_config(llada_copy, **changes)
    code, out, err = _memory(f"pretrained={llada_copy},tp_size=2", capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("pvf-dlm memory: ") and says in err, err


@pytest.fixture(scope="module")
def gemma_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma")
    return {"published": make_gemma_folder(root / "published"),
            "saved": make_saved_gemma_folder(root / "saved")}


@pytest.mark.parametrize("form,path,value,says", [
    # a traceback from the meta-device build (TypeError: empty() ... Overflow)
    ("published", ("text_config", "global_head_dim"), 2 ** 64, "text_config.global_head_dim is "
                                                               "18446744073709551616"),
    ("saved", ("text_config", "per_layer_config", "5", "head_dim"), 2 ** 64,
     'text_config.per_layer_config["5"].head_dim is 18446744073709551616'),
    ("published", ("text_config", "global_head_dim"), 2 ** 44, "num_attention_heads x "
                                                               "global_head_dim x hidden_size"),
    ("published", ("text_config", "num_global_key_value_heads"), 10 ** 12,
     "text_config.num_global_key_value_heads=1000000000000 key/value heads do not divide"),
    ("published", ("text_config", "top_k_experts"), 10 ** 12, "text_config.top_k_experts is "
                                                              "1000000000000"),
    # a table of a window and a canvas no context holds
    ("published", ("text_config", "sliding_window"), 10 ** 12, "sliding_window=1000000000000 "
                                                               "exceeds 16777216 tokens"),
    ("published", ("canvas_length",), 10 ** 12, "canvas_length=1000000000000 exceeds"),
    ("published", ("text_config", "num_attention_heads"), -16, "text_config.num_attention_heads "
                                                               "is -16"),
])
def test_a_diffusion_gemma_config_the_loader_refuses_is_one_line(gemma_folders, tmp_path, capsys,
                                                                 form, path, value, says):
    folder = shutil.copytree(gemma_folders[form], tmp_path / "g")
    cfg = json.loads((folder / "config.json").read_text())
    inner = cfg
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    code, out, err = _memory(f"pretrained={folder},gen_length=64", capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("pvf-dlm memory: ") and says in err, err


def test_a_string_head_dim_is_one_line(tmp_path, capsys):
    folder = make_sdar_folder(tmp_path / "sdar")
    edit_config(folder, head_dim="16")
    code, out, err = _memory(f"pretrained={folder}", capsys)
    assert code == 2 and out == ""
    assert err.endswith("config.json: head_dim is \"16\"; a SDAR checkpoint needs it as a positive "
                        "integer below 2^63\n")


@pytest.mark.parametrize("key", ["gen_length", "prompt_length"])
def test_lengths_past_the_longest_context_are_one_line(llada_copy, capsys, key):
    code, out, err = _memory(f"pretrained={llada_copy},{key}={(1 << 24) + 1}", capsys)
    assert code == 2 and out == ""
    assert err == f"pvf-dlm memory: {key}='16777217' must be at most 16777216 positions\n"
