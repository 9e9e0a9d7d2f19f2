"""Hostile inputs beyond checkpoint folders (those are in test_hostile_checkpoints.py): numbers
that would hang a decode or exhaust memory, planning-vocabulary files that block or never end or
claim this tokenizer with ids that contradict it. Each fails before any decoding, in one line
naming the argument or file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.bounds import bounded
from helpers.edited_folders import edit_json

from pvf_lmeval.decoding.params import make_params

pytestmark = pytest.mark.usefixtures("one_thread")


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


# --- planning-vocabulary artifacts that claim this tokenizer -------------------------------------

@pytest.fixture(scope="module")
def llada_tok():
    from pvf_lmeval.models.loader import checkpoint_folder, load_tokenizer

    return load_tokenizer(checkpoint_folder("tiny-llada"))


def _claiming(tok, records, kind="hand-written") -> dict:
    """An artifact that claims ``tok``'s vocab_hash, holding ``records`` (id, string, stats)."""
    from pvf_lmeval.planning.vocab import tokenizer_hash

    return {"format_version": 1, "kind": kind, "model_family": "llada",
            "task_family": "math-word", "model": "x",
            "tokenizer": {"name": "x", "vocab_hash": tokenizer_hash(tok)}, "tokens": records}


def test_an_artifact_whose_ids_contradict_its_strings_is_refused(tmp_path, llada_tok):
    from pvf_lmeval.planning.vocab import resolve_vocab

    vocab = llada_tok.get_vocab()
    art = _claiming(llada_tok, [{"id": vocab["ĠStep"], "string": "ĠStep"},
                                {"id": vocab["Ġ="], "string": "####"}])
    path = tmp_path / "liar.json"
    path.write_text(json.dumps(art))
    with pytest.raises(ValueError) as err:
        resolve_vocab(str(path), tokenizer=llada_tok, model_family="llada")
    assert str(err.value) == (f"vocab artifact {path}: id {vocab['Ġ=']} is 'Ġ=' in this tokenizer, "
                              f"not '####' as the artifact says, although its vocab_hash matches")


@pytest.mark.parametrize("kind", ["calibrated", "online"])
def test_online_seed_ids_outside_the_tokenizer_are_an_error_as_for_vocab(tmp_path, llada_tok, kind):
    from pvf_lmeval.planning.vocab import artifact_statistics, load_artifact, resolve_vocab

    stats = {"n": 10, "ver": 8, "gain": 0.5}
    art = _claiming(llada_tok, [{"id": 5, "string": llada_tok.convert_ids_to_tokens(5), **stats},
                                {"id": 10 ** 6, "string": "Ġzzz", **stats}], kind=kind)
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(art))
    message = (f"vocab artifact {path}: id 1000000 is outside this tokenizer (size "
               f"{len(llada_tok)}) although its vocab_hash matches")
    with pytest.raises(ValueError) as err:
        artifact_statistics(load_artifact(path), llada_tok, "llada")
    assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        resolve_vocab(str(path), tokenizer=llada_tok, model_family="llada")
    assert str(err.value) == message


# --- chat templates: the checkpoint's program, rendered with a time, memory and output limit ------

LOOPS = ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
         "{{ messages[0]['content'] }}")


@pytest.fixture
def template_tok():
    """A fresh tiny-llada tokenizer whose chat template a test replaces."""
    from pvf_lmeval.models.loader import checkpoint_folder, load_tokenizer

    return load_tokenizer(checkpoint_folder("tiny-llada"))


def _render(tok, template: str) -> str:
    from pvf_lmeval.models.chat_render import RENDERER

    tok.chat_template = template
    return RENDERER.render(tok, [{"role": "user", "content": "1 + 2?"}], add_generation_prompt=True,
                           continue_final_message=False, where="'m'")


@pytest.mark.parametrize("template, message", [
    ("{{ 'x' * 20000000 }}", "the rendered prompt has 20000000 characters, more than 16777216"),
    ("{{ 'x' * 10000000000 }}", "it needs more memory than the renderer's limit"),
    ("{{ raise_exception('roles must alternate') }}", "TemplateError: roles must alternate"),
])
def test_a_template_that_builds_too_much_or_fails_is_one_line(template_tok, template, message):
    with bounded(60, extra_bytes=256 << 20):
        with pytest.raises(ValueError) as err:
            _render(template_tok, template)
    assert str(err.value) == f"pvf-dlm: the chat template of 'm' failed: {message}"
    assert _render(template_tok, "<{{ messages[0]['content'] }}>") == "<1 + 2?>"


def test_a_checkpoints_template_that_never_ends_is_stopped_at_the_time_limit(tmp_path, monkeypatch):
    import shutil
    import time

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM
    from pvf_lmeval.models import chat_render
    from pvf_lmeval.models.loader import FIXTURES_DIR

    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURES_DIR / "tiny-llada", folder)
    edit_json(folder / "tokenizer_config.json", {"chat_template": LOOPS})
    lm = PVFDiffusionLM(pretrained=str(folder), device="cpu", vocab="none")
    assert lm.tokenizer.chat_template == LOOPS
    monkeypatch.setattr(chat_render, "TIME_LIMIT", 1.0)
    lm.tokenizer.chat_template = "{{ messages[0]['content'] }}"
    assert lm.apply_chat_template([{"role": "user", "content": "1 + 2?"}]) == "1 + 2?"  # started
    lm.tokenizer.chat_template = LOOPS
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        lm.apply_chat_template([{"role": "user", "content": "1 + 2?"}])
    assert time.monotonic() - start < 10
    assert str(err.value) == (f"pvf-dlm: the chat template of {str(folder)!r} did not finish "
                              f"within 1 s (a loop that does not end?)")
    # the worker was stopped; the next render has a fresh one
    lm.tokenizer.chat_template = "<{{ messages[0]['content'] }}>"
    assert lm.apply_chat_template([{"role": "user", "content": "1 + 2?"}]) == "<1 + 2?>"


def test_pvf_calibrate_renders_a_checkpoints_template_in_the_worker(tmp_path, capsys):
    """pvf-calibrate --apply-chat-template goes through the same renderer: a template that
    raises is one line naming the checkpoint, exit 2, before any prompt is measured."""
    import shutil

    from pvf_lmeval.cli.calibrate import main
    from pvf_lmeval.models.loader import FIXTURES_DIR

    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURES_DIR / "tiny-llada", folder)
    edit_json(folder / "tokenizer_config.json",
              {"chat_template": "{{ raise_exception('no user role here') }}"})
    code = main(["--model", str(folder), "--no-progress", "--family", "math", "--data", "arith",
                 "--apply-chat-template", "--out", str(tmp_path / "v.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (f"pvf-calibrate: the chat template of {str(folder)!r} failed: TemplateError: "
                   f"no user role here")
    assert not (tmp_path / "v.json").exists()
