"""Numeric config.json values of every family, typed and bounded before anything is allocated.

Each family's folder is built from its published config (``helpers/qwen_folders.py``,
``helpers/moe_folders.py``, ``helpers/hub_folders.py``: every key as released, sizes scaled
down). A size, count or index is an integer (a float such as 16.0 or a string such as "16" is
refused: the reference modeling code passes it to ``nn.Linear``, ``topk`` or ``view``, which take
integers only), a float is a finite number in its range, a product of sizes stays within the
caps of ``models/validation.py``; each refusal is one line naming the key, before any weight is
read. The property test sets every numeric key of every family to a negative, zero, float,
string, NaN, infinite or huge value: each loads with logits free of NaN and +inf or fails in one line naming
the key (or, for a value of the right type, the weight the safetensors headers hold that
contradicts it), and a load of a value equal to the published one gives the published logits
exactly."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from helpers.bounds import bounded
from helpers.edited_folders import DROP, edited_copy
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


def _numeric_keys(folder) -> list[str]:
    cfg = json.loads((folder / "config.json").read_text())
    return sorted(k for k, v in cfg.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool))


#: a canvas every family's vocabulary holds (ids below 691, the smallest fixture vocabulary)
TOKENS = torch.tensor([[3, 17, 101, 250, 5, 9, 400, 77]])


def _logits(model) -> torch.Tensor:
    x = TOKENS.clone()
    x[0, 4:] = model.mask_id
    return model.logits(x, torch.arange(x.shape[1]))


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
        key = data.draw(st.sampled_from(keys))
        value = _replace(base[key], data.draw(st.sampled_from(KINDS)))
        (work / "config.json").write_text(json.dumps({**base, key: value}))
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
        equal = (not isinstance(value, (str, bool)) and value == base[key]
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
