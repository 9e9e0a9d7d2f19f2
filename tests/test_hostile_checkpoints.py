"""Hostile and broken checkpoint folders: every one fails before anything is allocated for it,
in one line naming the file and the key (or weight) at fault; none is taken for a hub id."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from helpers.bounds import bounded
from helpers.edited_folders import DROP, edit_config
import torch

from pvf_lmeval.models.formats import UnsupportedCheckpoint
from pvf_lmeval.models.loader import FIXTURES_DIR, load_model, weights_fingerprint
from pvf_lmeval.models.tokenizer_files import TokenizerFilesError
from pvf_lmeval.models.validation import read_header

pytestmark = pytest.mark.usefixtures("one_thread")



def _copy(tmp_path: Path, family: str = "llada") -> Path:
    folder = tmp_path / f"ckpt-{family}"
    shutil.copytree(FIXTURES_DIR / f"tiny-{family}", folder)
    return folder


def _fails(folder: Path, *needles: str, error=UnsupportedCheckpoint) -> str:
    with bounded():
        with pytest.raises(error) as exc:
            load_model(str(folder), device="cpu")
    msg = str(exc.value)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


# --- config.json against the headers and against sane ranges -----------------------------------

def test_a_billion_layers_fail_before_any_module_is_built(tmp_path):
    folder = _copy(tmp_path)
    edit_config(folder, n_layers=10 ** 9)
    msg = _fails(folder, str(folder / "config.json"), "n_layers=1000000000")
    assert msg.endswith("but the weights hold layers 0..3 (4 layers)")


def test_fewer_layers_than_the_weights_hold(tmp_path):
    folder = _copy(tmp_path, "dream")
    edit_config(folder, num_hidden_layers=3)
    _fails(folder, "num_hidden_layers=3", "layers 0..3 (4 layers)")


@pytest.mark.parametrize("family,key", [("llada", "embedding_size"), ("dream", "vocab_size")])
def test_a_vocabulary_of_10_12_is_a_shape_error_naming_the_weight(tmp_path, family, key):
    folder = _copy(tmp_path, family)
    edit_config(folder, **{key: 10 ** 12})
    embed = "model.transformer.wte.weight" if family == "llada" else "model.embed_tokens.weight"
    width = 128 if family == "llada" else json.loads((folder / "config.json").read_text())["hidden_size"]
    _fails(folder, str(folder / "model.safetensors"), repr(embed), f"[1000000000000, {width}]")


def test_heads_that_do_not_divide_the_width(tmp_path):
    folder = _copy(tmp_path)
    edit_config(folder, n_heads=3, n_kv_heads=3)
    _fails(folder, "config.json", "n_heads=3 attention heads do not divide the width d_model=128")


def test_kv_heads_that_do_not_divide_the_heads(tmp_path):
    folder = _copy(tmp_path)
    edit_config(folder, n_kv_heads=3)
    _fails(folder, "config.json", "n_kv_heads=3 key/value heads do not divide the 4")


def test_a_narrower_width_names_the_first_misshapen_weight(tmp_path):
    folder = _copy(tmp_path)
    edit_config(folder, d_model=64, mlp_ratio=6)
    _fails(folder, "model.safetensors", "'model.transformer.wte.weight' has shape [691, 128]",
           "implies [691, 64]")


@pytest.mark.parametrize("key,value", [("mask_token_id", 10 ** 6), ("eos_token_id", [686, 691]),
                                       ("pad_token_id", 691)])
def test_token_ids_outside_the_vocabulary(tmp_path, key, value):
    folder = _copy(tmp_path)
    edit_config(folder, **{key: value})
    _fails(folder, "config.json", f"{key}={json.dumps(value)} is outside the model's "
                                  f"vocabulary of 691 embeddings")


@pytest.mark.parametrize("value", [-1, "7", 1.5, True, [690]])
def test_token_ids_that_are_not_ids(tmp_path, value):
    folder = _copy(tmp_path)
    edit_config(folder, mask_token_id=value)
    msg = _fails(folder, "config.json", f"mask_token_id={json.dumps(value)} must be a "
                                        f"non-negative integer token id")
    assert msg.endswith("token id")            # one id: a list is for eos_token_id only


def test_a_mask_id_from_the_tokenizer_outside_the_embeddings(tmp_path):
    folder = _copy(tmp_path)
    edit_config(folder, mask_token_id=DROP, embedding_size=689, vocab_size=689)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    for name in ("model.transformer.wte.weight", "model.transformer.ff_out.weight"):
        tensors[name] = tensors[name][:689].contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _fails(folder, "(config.json and tokenizer)", "mask_token_id=690 is outside",
           "689 embeddings")


def test_a_mask_id_that_is_also_the_end_id_names_the_tokenizers_mask(tmp_path):
    """mask = eos = pad in config.json (as a third-party LLaDA-MoE config class has it): the
    decoders never predict the mask token, so that end could never be written."""
    folder = _copy(tmp_path)
    edit_config(folder, mask_token_id=686)
    # 689 is the tokenizer's <|eot_id|>, an end of turn
    msg = _fails(folder, "(config.json and tokenizer)", "mask_token_id=686 is also an "
                 "end-of-text id (end ids [686, 689]): a masked diffusion LM needs a mask token of its own")
    assert msg.endswith("; the tokenizer's mask token <|mdm_mask|> is id 690: set mask_token_id "
                        "to it in config.json")


def test_a_mask_id_that_is_also_the_end_id_without_a_mask_token(tmp_path):
    folder = _copy(tmp_path)
    edit_config(folder, mask_token_id=686)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = folder / name
        path.write_text(path.read_text().replace("<|mdm_mask|>", "<|unused_690|>"))
    msg = _fails(folder, "mask_token_id=686 is also an end-of-text id")
    assert msg.endswith("needs a mask token of its own")


@pytest.mark.parametrize("value", ["abc", -1e-5, 0, float("nan"), float("inf"), 2.0, None])
def test_epsilons_that_are_not_small_positive_numbers(tmp_path, value):
    folder = _copy(tmp_path)
    edit_config(folder, rms_norm_eps=value)
    _fails(folder, "config.json", f"rms_norm_eps={json.dumps(value)} must be a finite number "
                                  f"between 0 and 1")


@pytest.mark.parametrize("family,key", [("llada", "max_sequence_length"),
                                        ("dream", "max_position_embeddings")])
@pytest.mark.parametrize("value", [-5, 0, 10 ** 12, "4096", 4096.0])
def test_lengths_that_are_not_positive_bounded_integers(tmp_path, family, key, value):
    folder = _copy(tmp_path, family)
    edit_config(folder, **{key: value})
    _fails(folder, "config.json", f"{key}={json.dumps(value)} must be an integer from 1 to "
                                  f"16777216")


@pytest.mark.parametrize("value", ["abc", 0, -1.0])
def test_rope_theta_must_be_positive(tmp_path, value):
    folder = _copy(tmp_path)
    edit_config(folder, rope_theta=value)
    _fails(folder, "config.json", f"rope_theta={json.dumps(value)} must be a positive finite")


@pytest.mark.parametrize("changes,needle", [
    ({"mlp_ratio": {}, "mlp_hidden_size": DROP}, "mlp_ratio is {}; a LLaDA checkpoint needs it as "
                                                 "a positive integer"),
    ({"mlp_hidden_size": "384"}, "mlp_hidden_size is \"384\"; a LLaDA checkpoint needs it as a "
                                 "positive integer"),
    ({"n_kv_heads": "4"}, "n_kv_heads is \"4\"; a LLaDA checkpoint needs it as a positive integer"),
    ({"model_type": ["llada"]}, "model_type=['llada'] must be a string"),
])
def test_strings_and_objects_where_numbers_belong(tmp_path, changes, needle):
    folder = _copy(tmp_path)
    edit_config(folder, **changes)
    _fails(folder, "config.json", needle)


def test_config_json_that_is_not_an_object(tmp_path):
    folder = _copy(tmp_path)
    (folder / "config.json").write_text("[1, 2]")
    _fails(folder, "config.json: a config must be a JSON object, found list")
    (folder / "config.json").write_text("{")
    _fails(folder, "config.json: not a readable JSON config")


def test_a_missing_weight_is_named_before_loading(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.transformer.blocks.2.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _fails(folder, "the weights lack 'model.transformer.blocks.2.up_proj.weight'",
           "shape [384, 128]")


def test_a_bias_the_config_does_not_have(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.transformer.blocks.0.q_proj.bias"] = torch.zeros(128)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _fails(folder, "model.safetensors: weight 'model.transformer.blocks.0.q_proj.bias' is not "
                   "part of the network")


# --- safetensors headers -------------------------------------------------------------------------

def _header_file(path: Path, header: dict, data: bytes = b"", length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize("length", [2 ** 63, 10 ** 9])
def test_a_header_length_beyond_the_file_is_not_read(tmp_path, length):
    f = _header_file(tmp_path / "x.safetensors", {}, length=length)
    with bounded(extra_bytes=64 << 20), pytest.raises(UnsupportedCheckpoint,
                                                      match="exceeds the file's"):
        read_header(f)


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [10 ** 12, 10 ** 12], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 1 << 40]},
    {"dtype": "XX", "shape": [2, 2], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": "2x2", "data_offsets": [0, 16]},
    [1, 2, 3],
])
def test_header_entries_that_do_not_describe_their_bytes(tmp_path, entry):
    f = _header_file(tmp_path / "x.safetensors", {"w": entry}, data=bytes(16))
    with pytest.raises(UnsupportedCheckpoint) as exc:
        read_header(f)
    assert str(exc.value) == (f"{f}: header entry 'w' is not a valid tensor (dtype, shape and "
                              f"data offsets inside the file); re-download it")


def test_a_truncated_weight_file(tmp_path):
    folder = _copy(tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x01\x02")
    _fails(folder, f"{folder / 'model.safetensors'}: not a readable safetensors file (2 bytes")


# --- shards stay inside the folder -----------------------------------------------------------------

def _sharded(folder: Path, shard_name: str) -> None:
    """Point every weight of ``folder`` at ``shard_name`` through an index."""
    names = list(read_header(folder / "model.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard_name for n in names}}))


@pytest.mark.parametrize("shard", ["ABS", "../elsewhere/model.safetensors",
                                   "sub/../../elsewhere/model.safetensors"])
def test_shards_outside_the_folder_are_refused(tmp_path, shard):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(FIXTURES_DIR / "tiny-llada", elsewhere)
    folder = _copy(tmp_path)
    shard = str(elsewhere / "model.safetensors") if shard == "ABS" else shard
    _sharded(folder, shard)
    (folder / "model.safetensors").unlink()
    msg = _fails(folder, str(folder / "model.safetensors.index.json"), repr(shard),
                 "outside the checkpoint folder")
    with pytest.raises(UnsupportedCheckpoint) as exc:
        weights_fingerprint(folder)
    assert str(exc.value) == msg


def test_a_shard_that_links_out_of_the_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(FIXTURES_DIR / "tiny-llada", elsewhere)
    folder = _copy(tmp_path)
    _sharded(folder, "shard.safetensors")
    (folder / "model.safetensors").unlink()
    (folder / "shard.safetensors").symlink_to(elsewhere / "model.safetensors")
    _fails(folder, "shard 'shard.safetensors' resolves to", str(elsewhere / "model.safetensors"),
           "outside the checkpoint folder")


def test_a_model_safetensors_that_links_out_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(FIXTURES_DIR / "tiny-llada", elsewhere)
    folder = _copy(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(elsewhere / "model.safetensors")
    _fails(folder, "resolves to", "outside the checkpoint folder")


def test_a_link_inside_the_folder_is_followed(tmp_path):
    folder = _copy(tmp_path)
    (folder / "blobs").mkdir()
    (folder / "model.safetensors").rename(folder / "blobs" / "abc")
    (folder / "model.safetensors").symlink_to(Path("blobs") / "abc")
    assert load_model(str(folder), device="cpu").net.cfg.n_layers == 4


@pytest.mark.parametrize("index", ['{"weight_map": []}', '{"weight_map": {"a": 3}}', "[]", "{"])
def test_malformed_indexes(tmp_path, index):
    folder = _copy(tmp_path)
    (folder / "model.safetensors.index.json").write_text(index)
    _fails(folder, str(folder / "model.safetensors.index.json"))


# --- local paths are never taken for hub ids --------------------------------------------------------

@pytest.fixture
def no_hub(monkeypatch):
    import huggingface_hub

    asked = []

    def fake(repo_id, **kw):
        asked.append(repo_id)
        raise RuntimeError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return asked


@pytest.mark.parametrize("name", ["checkpoints/llada-ft", "./llada-ft", "../llada-ft",
                                  "~/no-such-llada-ft", "/no/such/llada-ft", "."])
def test_a_missing_local_path_is_an_error_not_a_download(tmp_path, monkeypatch, no_hub, name):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work" if name.startswith("../") else tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    if name == ".":
        monkeypatch.chdir(tmp_path / "checkpoints")
    with pytest.raises(ValueError) as exc:
        load_model(name, device="cpu")
    msg = str(exc.value)
    assert no_hub == []
    if name == ".":       # the folder exists: it is read as a checkpoint folder
        assert msg.endswith("has no config.json")
    else:
        assert msg == (f"pretrained={name!r}: no such checkpoint folder (written as a local path, "
                       f"so it is not looked up on the hub; bundled models: tiny-llada, tiny-dream)")


def test_an_owner_name_without_a_local_owner_folder_is_a_hub_id(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as exc:
        load_model("someone/llada-ft", device="cpu")
    assert no_hub == ["someone/llada-ft"]
    assert str(exc.value) == ("pretrained='someone/llada-ft': could not fetch from the hub "
                              "(RuntimeError: offline)")


@pytest.mark.parametrize("experts, says", [
    (10**9, "config.json: 1000000000 experts, but the weights hold 8 for 'blocks.1.mlp.gate_proj'"),
    (12, ": the checkpoint lacks expert(s) [8, 9, 10, 11] of "
         "'model.layers.1.mlp.experts.8.gate_proj.weight'"),
])
def test_an_expert_count_the_weights_do_not_hold_fails_fast_in_one_line(tmp_path, experts, says):
    """LLaDA 2.x with 8 experts per routed layer in its weights: a config.json that claims 10**9
    (or 12) is refused before the experts are enumerated or anything is allocated."""
    from helpers.moe_folders import make_llada2_folder

    folder = make_llada2_folder(tmp_path / "m")
    edit_config(folder, num_experts=experts)
    with bounded(seconds=30, extra_bytes=256 << 20), pytest.raises(UnsupportedCheckpoint) as info:
        load_model(str(folder), device="cpu", dtype="float32")
    assert str(info.value) == f"{folder}{'/' if says.startswith('config') else ''}{says}"


# --- files that block or never end, tokenizer files that lead out of the folder -----------------

@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_checkpoint_files_that_block_or_never_end_are_refused(tmp_path, name, kind):
    folder = _copy(tmp_path)
    (folder / name).unlink()
    if kind == "fifo":
        os.mkfifo(folder / name)
    else:
        (folder / name).symlink_to("/dev/zero")
    error = UnsupportedCheckpoint if name == "config.json" else TokenizerFilesError
    if kind == "fifo":
        _fails(folder, str(folder / name), "is a FIFO, not a regular file", error=error)
    elif name == "config.json":
        _fails(folder, str(folder / name), "is a character device, not a regular file")
    else:       # a tokenizer file must also stay inside the folder
        _fails(folder, str(folder / name), "resolves to /dev/zero, outside the checkpoint folder",
               error=error)


def test_a_nested_tokenizer_config_is_one_line(tmp_path):
    folder = _copy(tmp_path)
    (folder / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    _fails(folder, str(folder / "tokenizer_config.json"), "not readable JSON",
           "maximum recursion depth exceeded", error=TokenizerFilesError)


# --- tokenizer files confined to the folder ------------------------------------------------------

def test_a_chat_template_linking_out_of_the_folder_is_refused(tmp_path):
    folder = _copy(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("{{ 'the secret' }}")
    (folder / "chat_template.jinja").symlink_to(secret)
    msg = _fails(folder, str(folder / "chat_template.jinja"), f"resolves to {secret}",
                 "outside the checkpoint folder", error=TokenizerFilesError)
    assert msg.endswith("(a symbolic link); tokenizer files must be files of the folder")


def test_a_tokenizer_file_linking_inside_the_folder_is_read(tmp_path):
    folder = _copy(tmp_path)
    (folder / "store").mkdir()
    (folder / "tokenizer.json").rename(folder / "store" / "t")
    (folder / "tokenizer.json").symlink_to(Path("store") / "t")
    assert load_model(str(folder), device="cpu").tokenizer.encode("1 + 2") == \
        load_model("tiny-llada", device="cpu").tokenizer.encode("1 + 2")


def test_a_hub_cache_snapshot_linking_into_its_blobs_loads(tmp_path):
    """snapshot_download's layout: snapshots/REV/<file> -> ../../blobs/<hash>."""
    repo = tmp_path / "models--o--tiny"
    snap = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted((FIXTURES_DIR / "tiny-llada").iterdir())):
        shutil.copyfile(f, repo / "blobs" / f"h{i}")
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"h{i}")
    model = load_model(str(snap), device="cpu")
    assert model.tokenizer.chat_template == load_model("tiny-llada", device="cpu").tokenizer.chat_template
    # the same links from a folder that is not a snapshot lead out of it
    other = tmp_path / "plain"
    shutil.copytree(snap, other, symlinks=True)
    (other / "x").mkdir()
    for f in list(other.iterdir()):
        if f.is_symlink():
            target = (snap / f.name).resolve()
            f.unlink()
            f.symlink_to(target)
    _fails(other, "outside the checkpoint folder")


# --- tokenizer ids and embedding rows ------------------------------------------------------------

def test_a_tokenizer_with_more_ids_than_embedding_rows_is_refused_at_load(tmp_path):
    folder = _copy(tmp_path)
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 691, "content": "<|extra|>", "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False,
                                "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    msg = _fails(folder)
    assert msg == (f"{folder}: the tokenizer's ids run to 691 but the embeddings have 691 rows: "
                   f"ids from 691 on could not be embedded")


# --- weights that decode garbage -----------------------------------------------------------------

def _rewrite(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, folder / "model.safetensors")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_weight_is_refused_at_load(tmp_path, value):
    folder = _copy(tmp_path)
    name = "model.transformer.blocks.2.ff_out.weight"

    def damage(w):
        w[name][3, 5] = value
    _rewrite(folder, damage)
    msg = _fails(folder)
    assert msg == (f"{folder / 'model.safetensors'}: weight {name!r} holds a non-finite value "
                   f"({value} at [3, 5]); the checkpoint is damaged")


@pytest.mark.parametrize("dtype, name", [(torch.int8, "I8"), (torch.uint8, "U8"), (torch.int32, "I32")])
def test_an_integer_weight_is_refused_before_loading(tmp_path, dtype, name):
    folder = _copy(tmp_path)
    weight = "model.transformer.blocks.0.q_proj.weight"

    def quantize(w):
        w[weight] = w[weight].mul(100).round().to(dtype)
    _rewrite(folder, quantize)
    msg = _fails(folder)
    assert msg == (f"{folder / 'model.safetensors'}: weight {weight!r} is stored as {name}; the "
                   f"network takes floating-point weights (F64, F32, F16, BF16, F8_E4M3, F8_E5M2), "
                   f"not quantized ones")


@pytest.mark.parametrize("name, message", [
    ("a" * 100_000, f"pretrained={'a' * 60!r}... (100000 characters) is not a checkpoint folder, hub "
                    f"id or bundled model name (at most 4096 characters, no NUL)"),
    ("x" * 300, f"pretrained={'x' * 300!r}: not a usable path (File name too long)"),
    ("a\0b", "pretrained='a\\x00b'... (3 characters) is not a checkpoint folder, hub id or bundled "
             "model name (at most 4096 characters, no NUL)"),
])
def test_a_pretrained_no_path_can_be_is_one_line(name, message, no_hub):
    with pytest.raises(ValueError) as exc:
        load_model(name, device="cpu")
    assert str(exc.value) == message
