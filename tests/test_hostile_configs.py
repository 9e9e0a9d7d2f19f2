"""Numeric config.json values of every family, typed and bounded before anything is allocated.

Each family's folder is built from its published config (``helpers/qwen_folders.py``,
``helpers/moe_folders.py``, ``helpers/hub_folders.py``, ``helpers/gemma_folders.py``: every key
as released, sizes scaled down); DiffusionGemma's also as its configuration class saves it
(``per_layer_config``). A size, count or index is an integer (a float such as 16.0 or a string
such as "16" is refused: the reference modeling code passes it to ``nn.Linear``, ``topk`` or
``view``, which take integers only, and DiffusionGemma's strict configuration class refuses it,
unless it drops the value as equal to the global one), a float is a finite number in its range,
a product of sizes stays within the caps of ``models/validation.py``; each refusal is one line
naming the key, before any weight is read. The property test sets every numeric key of every
family (nested ones too: DiffusionGemma's ``text_config``, its ``rope_parameters`` and
``per_layer_config``; not its vision tower's, which nothing reads) to a negative, zero, float,
string, NaN, infinite or huge value: each loads with logits free of NaN and +inf or fails in one
line naming the key (or, for a value of the right type, the weight the safetensors headers hold
that contradicts it), and a load of a value equal to the published one gives the published
logits exactly."""

from __future__ import annotations

import copy
import json
import math
import shutil

import pytest
import torch
from helpers.bounds import bounded
from helpers.edited_folders import DROP, edited_copy
from helpers.gemma_folders import make_gemma_folder, make_saved_gemma_folder
from helpers.hub_folders import make_dream_folder, make_llada_folder, make_mmada_folder
from helpers.moe_folders import make_llada2_folder, make_lladamoe_folder
from helpers.qwen_folders import make_fast_dllm_folder, make_rnd1_folder, make_sdar_folder

from pvf_lmeval.models.formats import UnsupportedCheckpoint
from pvf_lmeval.models.loader import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

BUILDERS = {
    "llada": make_llada_folder,
    "mmada": make_mmada_folder,
    "dream": make_dream_folder,
    "lladamoe": make_lladamoe_folder,
    "llada2": make_llada2_folder,
    "sdar": make_sdar_folder,
    "sdar_moe": lambda folder: make_sdar_folder(folder, moe=True, mlp_only_layers=[0]),
    "rnd1": make_rnd1_folder,
    "fast_dllm": make_fast_dllm_folder,
    "diffusion_gemma": make_gemma_folder,
    "diffusion_gemma_saved": make_saved_gemma_folder,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    return {name: make(root / name) for name, make in BUILDERS.items()}


def _refused(folder, key: str, shown: str) -> str:
    """The one-line refusal of ``folder`` (within the hostile-file bounds), naming ``key`` and
    the value as config.json spells it."""
    with bounded(seconds=30, extra_bytes=256 << 20), pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    msg = str(exc.value)
    assert "\n" not in msg, msg
    assert f"{key}={shown}" in msg or f"{key} is {shown}" in msg, msg
    return msg


# --- the values that reached allocation or the forward pass ------------------------------------

SIZES = [("sdar", "head_dim"), ("sdar_moe", "head_dim"), ("rnd1", "head_dim"),
         ("llada2", "head_dim"), ("llada2", "num_shared_experts"),
         ("llada2", "num_experts_per_tok"), ("llada2", "n_group"), ("llada2", "topk_group")]


@pytest.mark.parametrize("family,key", SIZES)
@pytest.mark.parametrize("value", [-16, 1.5, 2.0, "2"])
def test_a_size_that_is_not_a_positive_integer_is_one_line(folders, tmp_path, family, key, value):
    folder = edited_copy(folders[family], tmp_path / family, **{key: value})
    _refused(folder, key, json.dumps(value))


@pytest.mark.parametrize("family,key", SIZES)
def test_a_size_past_64_bits_is_one_line(folders, tmp_path, family, key):
    """A width of 2^64 fails on the product cap (its tensor) or its range (a count)."""
    folder = edited_copy(folders[family], tmp_path / family, **{key: 2 ** 64})
    with bounded(seconds=30, extra_bytes=256 << 20), pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    msg = str(exc.value)
    assert "\n" not in msg and (f"{key} is {2 ** 64}" in msg
                                or msg.endswith("more than one weight tensor may hold")), msg


@pytest.mark.parametrize("family", ["sdar", "sdar_moe", "rnd1"])
def test_a_null_or_zero_head_dim_is_refused_where_the_reference_cannot_use_it(folders, tmp_path,
                                                                            family):
    """Qwen3's attention sizes its projections by ``head_dim`` as config.json holds it: null or
    0 builds nothing the weights fit (LLaDA 2.x's config class maps both to the width / heads)."""
    for value in (None, 0):
        folder = edited_copy(folders[family], tmp_path / f"{family}-{value}", head_dim=value)
        _refused(folder, "head_dim", json.dumps(value))


def test_an_odd_head_dim_names_head_dim_not_the_width(folders, tmp_path):
    folder = edited_copy(folders["sdar"], tmp_path / "sdar", head_dim=15)
    msg = _refused(folder, "head_dim", "15")
    assert "32/4" not in msg and msg.endswith("head_dim=15 (head width) is odd; rotary "
                                              "embeddings need it even")


@pytest.mark.parametrize("key,value,says", [
    ("num_experts_per_tok", 9, "an integer from 1 to num_experts=8"),
    ("n_group", 3, "a divisor of num_experts=8"),
    ("n_group", 8, "at most 4 (num_experts=8 / 2: a group is scored by its two best experts)"),
    ("topk_group", 5, "an integer from 1 to n_group=4"),
])
def test_routing_counts_out_of_their_range_name_the_key(folders, tmp_path, key, value, says):
    folder = edited_copy(folders["llada2"], tmp_path / "llada2", **{key: value})
    assert says in _refused(folder, key, json.dumps(value))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), -1e30, -2.5, 0,
                                   1e30, "2.5", True])
def test_routed_scaling_factor_is_a_finite_positive_bounded_number(folders, tmp_path, value):
    """NaN, infinite or -1e30 loaded and decoded garbage; "2.5" was read as 2.5, where the
    reference's product with a string raises."""
    folder = edited_copy(folders["llada2"], tmp_path / "llada2", routed_scaling_factor=value)
    msg = _refused(folder, "routed_scaling_factor", json.dumps(value))
    assert msg.endswith("needs it as a finite number in (0, 1000]")


@pytest.mark.parametrize("value", [1, 2.5, 16.0])
def test_routed_scaling_factor_of_a_real_checkpoint_loads(folders, tmp_path, value):
    folder = edited_copy(folders["llada2"], tmp_path / "llada2", routed_scaling_factor=value)
    model = load_model(str(folder), device="cpu", dtype="float32")
    assert model.net.cfg.moe.scaling == value


@pytest.mark.parametrize("family,key", [("dream", "num_key_value_heads"),
                                        ("sdar", "num_key_value_heads"),
                                        ("lladamoe", "num_key_value_heads"),
                                        ("fast_dllm", "num_key_value_heads")])
def test_zero_key_value_heads_is_refused_and_null_means_one_per_head(folders, tmp_path, family,
                                                                     key):
    """Their config classes map null to the attention heads; 0 divides by zero in the reference
    (it was read as null)."""
    _refused(edited_copy(folders[family], tmp_path / "zero", **{key: 0}), key, "0")
    heads = json.loads((folders[family] / "config.json").read_text())["num_attention_heads"]
    folder = edited_copy(folders[family], tmp_path / "null", **{key: None})
    with pytest.raises(UnsupportedCheckpoint) as exc:      # the weights hold 2 key/value heads
        load_model(str(folder), device="cpu", dtype="float32")
    assert f"implies [{heads * _head_dim(folders[family])}," in str(exc.value)


def _head_dim(folder) -> int:
    cfg = json.loads((folder / "config.json").read_text())
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


@pytest.mark.parametrize("changes,key,shown", [
    ({"mlp_hidden_size": 0}, "mlp_hidden_size", "0"),       # LLaDA reads 0 as a width of 0
    ({"mlp_hidden_size": None, "mlp_ratio": 1.5}, "mlp_ratio", "1.5"),
    ({"mlp_hidden_size": None, "mlp_ratio": "3"}, "mlp_ratio", "\"3\""),
    ({"vocab_size": -1}, "vocab_size", "-1"),
    # LLaDA refuses an embedding table smaller than the vocabulary
    ({"vocab_size": 1000}, "vocab_size", "1000"),
])
def test_llada_widths(folders, tmp_path, changes, key, shown):
    _refused(edited_copy(folders["llada"], tmp_path / "llada", **changes), key, shown)


def test_an_embedding_size_of_null_is_the_vocabulary_as_llada_reads_it(folders, tmp_path):
    """LLaDA embeds ``embedding_size or vocab_size`` rows but first refuses an embedding_size
    below vocab_size: null (or absent) is the vocabulary, 0 is refused (it was read as null)."""
    _refused(edited_copy(folders["llada"], tmp_path / "zero", embedding_size=0),
             "embedding_size", "0")
    base = load_model(str(folders["llada"]), device="cpu", dtype="float32")
    x = torch.tensor([[5, 6, 7, base.mask_id]])
    for value in (None, DROP):
        folder = edited_copy(folders["llada"], tmp_path / f"e{value is None}",
                             embedding_size=value)
        model = load_model(str(folder), device="cpu", dtype="float32")
        assert torch.equal(model.logits(x, torch.arange(4)), base.logits(x, torch.arange(4)))


@pytest.mark.parametrize("family,key,value", [
    ("sdar", "block_size", (1 << 24) + 1), ("fast_dllm", "bd_size", (1 << 24) + 1),
    ("sdar", "block_size", 4.0), ("fast_dllm", "bd_size", 32.0),
])
def test_block_lengths_are_integers_within_the_longest_context(folders, tmp_path, family, key,
                                                              value):
    _refused(edited_copy(folders[family], tmp_path / family, **{key: value}), key,
             json.dumps(value))


@pytest.mark.parametrize("family,changes,says", [
    # products of sizes past what one tensor may hold fail before the meta-device build,
    # where torch's size arithmetic would overflow
    ("sdar", {"head_dim": 2 ** 44}, "num_attention_heads x head_dim x hidden_size"),
    ("dream", {"hidden_size": 2 ** 31, "num_attention_heads": 2 ** 28,
               "num_key_value_heads": 2 ** 28}, "x hidden_size"),
    ("sdar_moe", {"num_experts": 2 ** 22, "moe_intermediate_size": 2 ** 22},
     "num_experts x moe_intermediate_size x hidden_size"),
    # a derived width is named by its field: LLaDA 2.x's shared experts are
    # num_shared_experts x moe_intermediate_size wide
    ("llada2", {"num_shared_experts": 2 ** 40}, "shared_hidden x hidden_size"),
])
def test_products_of_sizes_within_the_cap(folders, tmp_path, family, changes, says):
    folder = edited_copy(folders[family], tmp_path / family, **changes)
    with bounded(seconds=30, extra_bytes=256 << 20), pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    msg = str(exc.value)
    assert "\n" not in msg and says in msg and "exceeds 2^48 elements" in msg, msg


@pytest.mark.parametrize("family,key,value,says", [
    # torch takes an integer theta as a 64-bit scalar: 2^64 loaded, then overflowed at the first
    # forward; no float holds 10^400 (math.isfinite raised)
    ("sdar", "rope_theta", 2 ** 64, "must be a positive finite number"),
    ("llada2", "rope_theta", 2 ** 64, "needs it as a positive number"),
    ("dream", "rms_norm_eps", 10 ** 400, "must be a finite number between 0 and 1"),
])
def test_numbers_past_what_torch_and_floats_hold_are_one_line(folders, tmp_path, family, key,
                                                            value, says):
    folder = edited_copy(folders[family], tmp_path / family, **{key: value})
    assert says in _refused(folder, key, json.dumps(value)[:40])     # long values are cut


# --- DiffusionGemma: text_config, its rotary parameters and per_layer_config ----------------------

def _set(config: dict, path: tuple, value) -> dict:
    """A deep copy of ``config`` with the value at ``path`` (keys into nested objects) set."""
    out = copy.deepcopy(config)
    inner = out
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return out


def _copy_with(src, dst, path: tuple, value):
    """A copy of folder ``src`` at ``dst`` whose config.json holds ``value`` at ``path``."""
    cfg = json.loads((src / "config.json").read_text())
    return edited_copy(src, dst, **{path[0]: _set(cfg, path, value)[path[0]]})


T = "text_config"
#: the counts of ``DiffusionGemmaTextConfig`` (``int`` fields: its strict dataclass refuses a
#: float, a string, a bool) the network is sized by
GEMMA_COUNTS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "global_head_dim",
                "num_global_key_value_heads", "num_experts", "top_k_experts",
                "moe_intermediate_size", "sliding_window", "max_position_embeddings"]


@pytest.mark.parametrize("key", GEMMA_COUNTS)
@pytest.mark.parametrize("value", [-16, 0, 1.5, "2", math.nan, math.inf, True])
def test_a_diffusion_gemma_count_that_is_not_a_positive_integer_is_one_line(folders, tmp_path,
                                                                             key, value):
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g", (T, key), value)
    _refused(folder, f"{T}.{key}", json.dumps(value))


@pytest.mark.parametrize("family,path,value", [
    ("diffusion_gemma", (T, "global_head_dim"), 2 ** 64),
    ("diffusion_gemma_saved", (T, "per_layer_config", "5", "head_dim"), 2 ** 64),
    *(("diffusion_gemma", (T, key), v) for v in (10 ** 12, 2 ** 64)
      for key in ("num_global_key_value_heads", "top_k_experts", "sliding_window")),
    ("diffusion_gemma_saved", (T, "per_layer_config", "5", "num_key_value_heads"), 10 ** 12),
    ("diffusion_gemma", ("canvas_length",), 10 ** 12),
    ("diffusion_gemma", ("canvas_length",), 2 ** 64),
])
def test_a_huge_diffusion_gemma_count_is_one_line_naming_it(folders, tmp_path, family, path,
                                                            value):
    """Past what the weights may hold, the heads divide, the experts number, a context holds or
    64 bits: one line naming the key. A global head width of 2^64 was a traceback from the
    meta-device build (in ``pvf-dlm memory`` too), 10^12 global key/value heads named
    ``num_key_value_heads``, 10^12 experts per token was "not a readable config", a window or a
    canvas of 10^12 loaded (a window of 2^64 then overflowed at the first forward)."""
    folder = _copy_with(folders[family], tmp_path / "g", path, value)
    with bounded(seconds=30, extra_bytes=256 << 20), pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    msg = str(exc.value)
    assert "\n" not in msg and path[-1] in msg, msg
    assert "weight '" not in msg and "not a readable" not in msg, msg


@pytest.mark.parametrize("family,path,says", [
    ("diffusion_gemma", (T, "global_head_dim"), "num_attention_heads x global_head_dim x "
                                                "hidden_size"),
    ("diffusion_gemma_saved", (T, "per_layer_config", "5", "head_dim"),
     'num_attention_heads x text_config.per_layer_config["5"].head_dim x hidden_size'),
])
def test_a_global_layer_past_the_weight_cap_is_one_line(folders, tmp_path, family, path, says):
    folder = _copy_with(folders[family], tmp_path / "g", path, 2 ** 44)
    with bounded(seconds=30, extra_bytes=256 << 20), pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    msg = str(exc.value)
    assert "\n" not in msg and says in msg and "exceeds 2^48 elements" in msg, msg


@pytest.mark.parametrize("key,value,says", [
    ("sliding_window", 10 ** 12, "exceeds 16777216 tokens"),
    ("canvas_length", 10 ** 12, "exceeds 16777216 tokens"),
    ("num_global_key_value_heads", 3, "text_config.num_global_key_value_heads=3 key/value "
                                      "heads do not divide num_attention_heads=4"),
    ("global_head_dim", 15, "text_config.global_head_dim=15 is odd; rotary embeddings need it "
                            "even"),
    ("top_k_experts", 9, "an integer from 1 to num_experts=8"),
    # no per-layer table of more layers than any checkpoint holds (checked against the weights
    # later)
    ("num_hidden_layers", 65537, "an integer from 1 to 65536"),
])
def test_diffusion_gemma_sizes_out_of_their_range_name_the_key(folders, tmp_path, key, value,
                                                               says):
    path = (key,) if key == "canvas_length" else (T, key)
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g", path, value)
    assert says in _refused(folder, path[-1], json.dumps(value))


@pytest.mark.parametrize("value", [-8, 0, 8.0, "8", math.nan, None, 2 ** 64])
def test_a_canvas_length_that_is_not_a_positive_integer_is_one_line(folders, tmp_path, value):
    """``DiffusionGemmaConfig.canvas_length`` is ``int | None``; ``generate`` divides by it and
    sizes the canvas with it: null, 0 or a negative one cannot decode."""
    folder = edited_copy(folders["diffusion_gemma"], tmp_path / "g", canvas_length=value)
    _refused(folder, "canvas_length", json.dumps(value))


@pytest.mark.parametrize("key,value", [
    ("rms_norm_eps", v) for v in (-1e-6, 0, 1, "1e-06", math.nan, math.inf, 1e300, True)] + [
    ("final_logit_softcapping", v) for v in (-30.0, 0, "30", math.nan, math.inf, 1e300, 2 ** 64,
                                             True, None)])
def test_diffusion_gemma_numbers_are_finite_and_positive(folders, tmp_path, key, value):
    """A softcap of 1e300 loaded and gave NaN logits (the cap is applied in float32, where
    1e300 is infinite); 0, NaN or infinite ones do so in the reference; a string raises there."""
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g", (T, key), value)
    _refused(folder, key, json.dumps(value))


def _rope(kind: str, key: str) -> tuple:
    return (T, "rope_parameters", kind, key)


@pytest.mark.parametrize("kind", ["sliding_attention", "full_attention"])
@pytest.mark.parametrize("value", [-1.0, 0, "1e4", math.nan, math.inf, 2 ** 64,
                                   pytest.param(10 ** 400, id="10^400"), True, None])
def test_a_rope_theta_is_a_finite_positive_number(folders, tmp_path, kind, value):
    """10^400 was "not a readable config" (OverflowError); 2^64 overflows the reference's build;
    -1, 0, NaN and inf load there and rotate by nothing or garbage."""
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g", _rope(kind, "rope_theta"),
                        value)
    _refused(folder, f"{kind}.rope_theta", json.dumps(value)[:40])


@pytest.mark.parametrize("kind,value", [
    ("sliding_attention", v) for v in (0.5, 0.25, 0, -1, 1.5, "1", math.nan)] + [
    ("full_attention", v) for v in (0, -0.25, 1.5, "0.25", math.nan, math.inf)])
def test_a_partial_rotary_factor_the_reference_cannot_run_is_one_line(folders, tmp_path, kind,
                                                                      value):
    """The sliding layers' default rotary turns the whole head in the reference (a factor below 1
    sizes its tables smaller than the head, and its forward raises; 0.5 loaded here and rotated
    half the head); the global layers' proportional one takes a factor in (0, 1] that turns at
    least one frequency pair."""
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g",
                        _rope(kind, "partial_rotary_factor"), value)
    _refused(folder, f"{kind}.partial_rotary_factor", json.dumps(value))


@pytest.mark.parametrize("key", ["eos_token_id", "pad_token_id", "bos_token_id"])
@pytest.mark.parametrize("value", [-1, 1.5, "1", math.nan])
def test_text_config_token_ids_are_token_ids_even_under_a_top_level_one(folders, tmp_path, key,
                                                                        value):
    """The top level's ``eos_token_id`` is the one in use; the text config's, which it hides,
    is still a token id (the configuration class refuses a float or a string there): 1.5
    loaded unnoticed."""
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g", (T, key), value)
    _refused(folder, key, json.dumps(value))


def test_a_list_of_end_ids_under_a_top_level_one_loads(folders, tmp_path):
    """The text config's ``eos_token_id`` may be a list (``int | list[int] | None``), as the top
    level's is: hidden by the top level's, it is checked as a list of token ids."""
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g", (T, "eos_token_id"), [1, 106])
    assert load_model(str(folder), device="cpu", dtype="float32").eos_ids == (1, 106)


@pytest.mark.parametrize("layer", ["2\u00b2", "-1", "6", "five"])
def test_a_per_layer_config_index_that_is_no_layer_is_one_line(folders, tmp_path, layer):
    """``"2²"`` passed ``str.isdigit`` and raised in ``int`` ("not a readable config")."""
    cfg = json.loads((folders["diffusion_gemma_saved"] / "config.json").read_text())
    plc = {layer: cfg[T]["per_layer_config"]["5"]}
    folder = _copy_with(folders["diffusion_gemma_saved"], tmp_path / "g",
                        (T, "per_layer_config"), plc)
    with bounded(seconds=30, extra_bytes=256 << 20), pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu", dtype="float32")
    msg = str(exc.value)
    assert "\n" not in msg and f"per_layer_config[{json.dumps(layer)}]" in msg, msg


@pytest.fixture(scope="module")
def even(tmp_path_factory):
    """A DiffusionGemma folder whose global layers have the sliding layers' shape (16 x 2), and
    its logits: what a float of the same value must load as."""
    folder = make_gemma_folder(tmp_path_factory.mktemp("even") / "g", global_head_dim=16,
                               num_global_key_value_heads=2)
    return folder, _logits(load_model(str(folder), device="cpu", dtype="float32"))


@pytest.mark.parametrize("changes", [
    {"global_head_dim": 16.0}, {"num_global_key_value_heads": 2.0},
    {"global_head_dim": 16.0, "num_global_key_value_heads": 2.0},
    {"global_head_dim": DROP, "num_global_key_value_heads": DROP,
     "per_layer_config": {"5": {"head_dim": 16.0, "num_key_value_heads": 2.0}}},
    {"global_head_dim": DROP, "num_global_key_value_heads": DROP,
     "per_layer_config": {"+5": {"head_dim": 16, "num_key_value_heads": 2}}},
])
def test_a_per_layer_value_equal_to_the_global_one_loads_as_it(even, tmp_path, changes):
    """The configuration class drops a per-layer override equal (``==``) to the global value
    before its strict type check, so a global layer's 16.0 beside a ``head_dim`` of 16 is 16;
    its index is read with ``int`` ("+5" is layer 5)."""
    from transformers import DiffusionGemmaTextConfig

    folder, logits = even
    cfg = json.loads((folder / "config.json").read_text())
    text = {k: v for k, v in cfg[T].items() if k not in changes or changes[k] is not DROP}
    text.update({k: v for k, v in changes.items() if v is not DROP})
    ref = DiffusionGemmaTextConfig(**{k: v for k, v in text.items()
                                      if k not in ("model_type", "dtype")})
    assert type(ref.per_layer_config[5].head_dim) is int          # the reference's reading
    model = load_model(str(edited_copy(folder, tmp_path / "g", **{T: text})), device="cpu",
                       dtype="float32")
    assert model.net.cfg.global_attention.head_dim == 16
    assert torch.equal(_logits(model), logits)


@pytest.mark.parametrize("path,value", [
    ((T, "final_logit_softcapping"), 30), (_rope("sliding_attention", "rope_theta"), 10000),
    (_rope("full_attention", "rope_theta"), 1000000),
    (_rope("sliding_attention", "partial_rotary_factor"), 1),
])
def test_a_number_written_as_an_integer_loads_as_the_float(folders, published, tmp_path, path,
                                                           value):
    """The configuration class types these as floats without refusing an integer, and the
    reference computes the same with it."""
    logits = published["diffusion_gemma"][3]
    folder = _copy_with(folders["diffusion_gemma"], tmp_path / "g", path, value)
    assert torch.equal(_logits(load_model(str(folder), device="cpu", dtype="float32")), logits)


# --- every numeric key of every family, by property ---------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

#: what each numeric value is replaced with
KINDS = ("negative", "zero", "float", "fraction", "string", "nan", "inf", "-inf", "huge",
         "beyond int64")


def _replace(value, kind: str):
    """``value`` (an int or a float of a published config) turned into a hostile ``kind``."""
    if kind == "negative":
        return -abs(value) if value else -1
    if kind == "zero":
        return 0
    if kind == "float":            # the same number in the other JSON spelling: 16 -> 16.0
        return float(value) if isinstance(value, int) else (int(value) if value.is_integer()
                                                            else value * 2)
    if kind == "fraction":
        return value + 0.5
    if kind == "string":
        return str(value)
    if kind == "huge":
        return 10 ** 12 if isinstance(value, int) else 1e300
    if kind == "beyond int64":
        return 2 ** 64
    return float(kind)


def _numeric_keys(folder) -> list[tuple[str, ...]]:
    """The paths (keys into nested objects) of config.json's numbers, the vision tower's left
    out (the text network reads none of its keys)."""
    def walk(obj: dict, path: tuple) -> list[tuple[str, ...]]:
        found = []
        for key, value in obj.items():
            if isinstance(value, dict) and key != "vision_config":
                found += walk(value, path + (key,))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                found.append(path + (key,))
        return found

    return sorted(walk(json.loads((folder / "config.json").read_text()), ()))


def _at(config: dict, path: tuple):
    for key in path:
        config = config[key]
    return config


#: a canvas every family's vocabulary holds (ids below 691, the smallest fixture vocabulary)
TOKENS = torch.tensor([[3, 17, 101, 250, 5, 9, 400, 77]])


def _logits(model) -> torch.Tensor:
    """Logits of the masked half of TOKENS; for a uniform-state model (no mask), of a canvas of
    TOKENS after a context of its first half."""
    if model.canvas_length is None:
        x = TOKENS.clone()
        x[0, 4:] = model.mask_id
        return model.logits(x, torch.arange(x.shape[1]))
    c = model.canvas_length
    x = torch.cat([TOKENS[:, :4], TOKENS.repeat(1, -(-c // TOKENS.shape[1]))[:, :c]], dim=1)
    return model.logits(x, torch.arange(4, 4 + c))


@pytest.fixture(scope="module")
def published(folders, tmp_path_factory):
    """Per family: (a working copy whose config.json the examples rewrite, the published
    config, its numeric keys, the published logits)."""
    root = tmp_path_factory.mktemp("work")
    out = {}
    for name, folder in folders.items():
        work = shutil.copytree(folder, root / name)
        base = json.loads((folder / "config.json").read_text())
        out[name] = (work, base, _numeric_keys(folder),
                     _logits(load_model(str(work), device="cpu", dtype="float32")))
    return out


def test_every_numeric_key_loads_as_published_or_fails_in_one_line_naming_it(published):
    names = sorted(published)

    @settings(derandomize=True, deadline=None, database=None, print_blob=False,
              max_examples=100, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data):
        name = data.draw(st.sampled_from(names))
        work, base, keys, logits = published[name]
        path = data.draw(st.sampled_from(keys))
        key, published_value = path[-1], _at(base, path)
        value = _replace(published_value, data.draw(st.sampled_from(KINDS)))
        (work / "config.json").write_text(json.dumps(_set(base, path, value)))
        try:
            with bounded(seconds=60, extra_bytes=512 << 20):
                model = load_model(str(work), device="cpu", dtype="float32")
        except ValueError as exc:          # the key, or the weight its new value contradicts
            msg = str(exc)
            assert "\n" not in msg, (name, key, value, msg)
            assert key in msg or "weight" in msg or "lacks expert" in msg, (name, key, value, msg)
            return
        got = _logits(model)          # -inf only where the model masks undecodable ids
        assert not bool(got.isnan().any() or (got == math.inf).any()), (name, key, value)
        equal = (not isinstance(value, (str, bool)) and value == published_value
                 and not (isinstance(value, float) and math.isnan(value)))
        if equal:
            assert torch.equal(got, logits), (name, key, value)

    run()


def test_a_reader_that_trips_on_a_json_type_is_one_line(folders, monkeypatch):
    """The loader's net under the readers: a type error no reader names yet is still one line
    naming the file and the format."""
    import dataclasses

    from pvf_lmeval.models import formats

    def trips(cfg):
        return cfg["hidden_size"] + "x"

    monkeypatch.setitem(formats.FORMATS, "Dream",
                        dataclasses.replace(formats.DREAM, read_config=trips))
    with pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folders["dream"]), device="cpu", dtype="float32")
    assert str(exc.value) == (f"{folders['dream'] / 'config.json'}: not a readable Dream config "
                              f"(TypeError: unsupported operand type(s) for +: 'int' and 'str')")


@pytest.mark.parametrize("moe,config,says", [
    (dict(top_k=2.0), {"num_experts_per_tok": 2.0}, "num_experts_per_tok=2.0 (top_k) must be a "
                                                    "positive integer"),
    (dict(shared_hidden=-16), {}, "shared_hidden=-16 (shared_hidden) must be a positive integer"),
    (dict(scaling=math.inf), {"routed_scaling_factor": math.inf},
     "routed_scaling_factor=Infinity (scaling) must be a positive finite number"),
])
def test_check_shape_checks_what_a_reader_let_through(moe, config, says):
    """The shape check under every reader: a routed-expert field of the wrong type or range is
    one line naming its key, whichever format built it."""
    from pvf_lmeval.models.moe import MoEConfig
    from pvf_lmeval.models.transformer import TransformerConfig
    from pvf_lmeval.models.validation import check_shape

    cfg = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            ffn_hidden=0, moe=MoEConfig(**{"n_experts": 8, "top_k": 2,
                                                           "expert_hidden": 16, **moe}))
    with pytest.raises(UnsupportedCheckpoint) as exc:
        check_shape(cfg, {"hidden_size": 32, **config}, "config.json")
    assert str(exc.value) == f"config.json: {says}"


@pytest.mark.parametrize("attention,config,says", [
    (dict(head_dim=16.0), {"global_head_dim": 16.0}, "global_head_dim=16.0 (head_dim) must be a "
                                                     "positive integer"),
    (dict(n_kv_heads=-1), {"num_global_key_value_heads": -1},
     "num_global_key_value_heads=-1 (n_kv_heads) must be a positive integer"),
    (dict(rope_theta=math.nan), {}, "rope_theta=NaN (rope_theta) must be a positive finite number"),
])
def test_check_shape_checks_a_global_layer_a_reader_let_through(attention, config, says):
    """The global layers' attention (DiffusionGemma's) under the same check as the rest."""
    from pvf_lmeval.models.transformer import LayerAttention, TransformerConfig
    from pvf_lmeval.models.validation import check_shape

    cfg = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            ffn_hidden=64, global_layers=(False, True),
                            global_attention=LayerAttention(**{"head_dim": 16, "n_kv_heads": 1,
                                                               "rope_theta": 1e6, **attention}))
    with pytest.raises(UnsupportedCheckpoint) as exc:
        check_shape(cfg, {"hidden_size": 32, **config}, "config.json")
    assert str(exc.value) == f"config.json: {says}"
