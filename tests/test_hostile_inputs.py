"""Hostile inputs beyond checkpoint shapes: numbers that would hang or exhaust memory, files
that block or never end, tokenizer files that lead out of their folder, weights that decode
garbage. Each fails before any decoding, in one line naming the argument or file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers.bounds import bounded

from pvf_lmeval.decoding.params import make_params
from pvf_lmeval.models.loader import FIXTURES_DIR, load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _copy(tmp_path: Path, family: str = "llada") -> Path:
    folder = tmp_path / f"ckpt-{family}"
    shutil.copytree(FIXTURES_DIR / f"tiny-{family}", folder)
    return folder


def _fails(folder: Path, *needles: str) -> str:
    with bounded(60):
        with pytest.raises(ValueError) as exc:
            load_model(str(folder), device="cpu")
    msg = str(exc.value)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


# --- numbers a user or a task file sets ---------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("inf")), "temperature=inf must be a finite number"),
    (dict(temperature="inf"), "temperature=inf must be a finite number"),
    (dict(width=10 ** 6), "width=1000000 must be at most 64 (rows one request sends in one model "
                          "call grow with it)"),
    (dict(width=65), "width=65 must be at most 64 (rows one request sends in one model call grow "
                     "with it)"),
    (dict(decoder="freedave", draft_steps=65), "draft_steps=65 must be at most 64 (rows one "
                                               "request sends in one model call grow with it)"),
    (dict(gen_length=1 << 25, block_length=32), "gen_length=33554432 must be at most 16777216 "
                                                "positions"),
    (dict(reveal_next=10 ** 30), "reveal_next=1000000000000000000000000000000 must be at most "
                                 "16777216 positions"),
    (dict(seed=1 << 63), "seed=9223372036854775808 must be a 64-bit integer in "
                         "[-9223372036854775808, 9223372036854775807]"),
    (dict(decoder="threshold", factor=float("inf")), "factor=inf must be a finite number"),
    (dict(width="9" * 100_000), "width='99999999999999999999999999999999999999999999999999999999999 "
                                "must be an integer"),
])
def test_numbers_out_of_bounds_are_one_line_naming_the_cap(kwargs, message):
    with pytest.raises(ValueError) as err:
        make_params(**{"decoder": "pvf", **kwargs})
    assert str(err.value) == message


def test_the_caps_are_inclusive():
    p = make_params("pvf", width=64, seed=(1 << 63) - 1, reveal_next=1 << 24)
    assert (p.width, p.seed, p.reveal_next) == (64, (1 << 63) - 1, 1 << 24)
    assert make_params("freedave", draft_steps=64).draft_steps == 64


# --- files that block or never end ---------------------------------------------------------------

def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_vocab_auto_skips_what_is_not_a_regular_file_without_blocking(tmp_path, monkeypatch, kind,
                                                                       caplog):
    from pvf_lmeval.planning import vocab

    user = tmp_path / "user"
    user.mkdir()
    target = user / "aaa.json"
    {"fifo": _fifo, "dev-zero": lambda p: p.symlink_to("/dev/zero"),
     "folder": lambda p: p.mkdir()}[kind](target)
    monkeypatch.setattr(vocab, "user_vocab_dir", lambda: user)
    with bounded(20, extra_bytes=256 << 20):
        arts = vocab.bundled_artifacts()
    assert arts and all(a["_path"] != str(target) for a in arts)
    what = {"fifo": "a FIFO", "dev-zero": "a character device", "folder": "a folder"}[kind]
    assert f"skipped {target}: unreadable (the artifact is {what}, not a regular file)" in caplog.text


def test_an_artifact_larger_than_the_cap_is_refused_unread(tmp_path):
    from pvf_lmeval.planning import vocab

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(vocab.MAX_ARTIFACT_BYTES + 1)       # sparse: nothing is written
    with pytest.raises(ValueError) as err:
        vocab.load_artifact(big)
    assert str(err.value) == (f"vocab artifact {big}: unreadable ({vocab.MAX_ARTIFACT_BYTES + 1} "
                              f"bytes is too large for a artifact (at most "
                              f"{vocab.MAX_ARTIFACT_BYTES}))")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_checkpoint_files_that_block_or_never_end_are_refused(tmp_path, name, kind):
    folder = _copy(tmp_path)
    (folder / name).unlink()
    if kind == "fifo":
        _fifo(folder / name)
    else:
        (folder / name).symlink_to("/dev/zero")
    if kind == "fifo":
        _fails(folder, str(folder / name), "is a FIFO, not a regular file")
    elif name == "config.json":
        _fails(folder, str(folder / name), "is a character device, not a regular file")
    else:       # a tokenizer file must also stay inside the folder
        _fails(folder, str(folder / name), "resolves to /dev/zero, outside the checkpoint folder")


def test_a_nested_tokenizer_config_is_one_line(tmp_path):
    folder = _copy(tmp_path)
    (folder / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    _fails(folder, str(folder / "tokenizer_config.json"), "not readable JSON",
           "maximum recursion depth exceeded")


# --- tokenizer files confined to the folder ------------------------------------------------------

def test_a_chat_template_linking_out_of_the_folder_is_refused(tmp_path):
    folder = _copy(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("{{ 'the secret' }}")
    (folder / "chat_template.jinja").symlink_to(secret)
    msg = _fails(folder, str(folder / "chat_template.jinja"), f"resolves to {secret}",
                 "outside the checkpoint folder")
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


def test_the_bounds_hold_for_model_args_and_generation_kwargs():
    """``--model_args`` fail before the model loads; ``--gen_kwargs`` and a task's
    ``generation_kwargs`` (one path: the request's generation kwargs) before any decoding."""
    from lm_eval.api.instance import Instance

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    with pytest.raises(ValueError) as err:
        PVFDiffusionLM(pretrained="no-such-model", device="cpu", decoder="pvf", width=10 ** 6)
    assert str(err.value) == ("width=1000000 must be at most 64 (rows one request sends in one "
                              "model call grow with it)")
    lm = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="pvf", gen_length=32,
                        block_length=32, vocab="none")

    def request(kwargs, doc):
        return Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", doc, 1),
                        arguments=("Question: 1 + 2?\nAnswer:", {"until": ["\n\n"], **kwargs}))

    for kwargs, message in [
            ({"temperature": float("inf"), "do_sample": True}, "temperature=inf must be a finite number"),
            ({"temperature": "inf", "do_sample": True}, "temperature=inf must be a finite number"),
            ({"width": 1000000}, "width=1000000 must be at most 64 (rows one request sends in one "
                                 "model call grow with it)")]:
        with pytest.raises(ValueError) as err:
            lm.generate_until([request({}, 0), request(kwargs, 1)], disable_tqdm=True)
        assert str(err.value) == message
    assert lm.get_model_info()["pvf"]["totals"] == {}             # nothing was decoded
