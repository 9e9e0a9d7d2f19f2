"""Planning-vocabulary artifacts: loading, picking and resolving against a tokenizer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pvf_lmeval.models.loader import checkpoint_folder, load_tokenizer
from pvf_lmeval.planning.vocab import (load_artifact, pick_artifact, resolve_artifact, resolve_vocab,
                              resolve_vocab_for, tokenizer_hash)


@pytest.fixture(scope="module")
def llada_tok():
    return load_tokenizer(checkpoint_folder("tiny-llada"))


@pytest.fixture(scope="module")
def dream_tok():
    return load_tokenizer(checkpoint_folder("tiny-dream"))


def write(tmp_path, data, name="a.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def artifact(tok, family="llada", tokens=("ĠStep", "Ġ="), **kw):
    vocab = tok.get_vocab()
    data = {"format_version": 1, "kind": "hand-written", "model_family": family,
            "task_family": "math-word", "model": "x",
            "tokenizer": {"name": "x", "vocab_hash": tokenizer_hash(tok)},
            "tokens": [{"id": vocab.get(t, 0), "string": t} for t in tokens]}
    data.update(kw)
    return data


def test_auto_picks_the_fixture_artifact(llada_tok):
    ids, source = resolve_vocab("auto", tokenizer=llada_tok, model_family="llada",
                                model_name="tiny-llada", task_family="math-word")
    # the calibrated artifact (pvf-calibrate, `make vocab`) wins over the hand-written one,
    # unless the calibration kept no token
    from pvf_lmeval.files.paths import vocab_artifacts_dir

    cal = load_artifact(vocab_artifacts_dir() / "tiny-llada.math-word.calibrated.json")
    assert cal["tokenizer"]["vocab_hash"] == tokenizer_hash(llada_tok)
    want = "calibrated" if cal["tokens"] else "hand-written"
    assert source.endswith(f"tiny-llada.math-word.{want}.json")
    art = load_artifact(source.split(":", 1)[1])
    assert ids == tuple(sorted(t["id"] for t in art["tokens"]))
    hand, _ = resolve_vocab("tiny-llada.math-word.hand-written", tokenizer=llada_tok,
                            model_family="llada")
    vocab = llada_tok.get_vocab()
    assert vocab["ĠStep"] in hand and vocab["Ġ="] in hand and vocab["####"] in hand
    assert pick_artifact("dream", "math-word", "tiny-dream")["model"] == "tiny-dream"
    assert pick_artifact("llada", "code")["kind"] == "heuristic"     # the 8B family heuristic


def test_auto_without_artifact_is_an_error(llada_tok, tmp_path, monkeypatch):
    monkeypatch.setattr("pvf_lmeval.planning.vocab.vocab_artifacts_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match="vocab=auto: no bundled planning vocabulary.*'code'"):
        resolve_vocab("auto", tokenizer=llada_tok, model_family="llada", task_family="code")


def test_auto_pick_order(llada_tok, tmp_path, monkeypatch, caplog):
    """Same tokenizer first, then same model name, then the family's heuristic, then the rest;
    within a rule calibrated > hand-written > heuristic; online artifacts are never picked."""
    monkeypatch.setattr("pvf_lmeval.planning.vocab.vocab_artifacts_dir", lambda: tmp_path)
    other = {"name": "o", "vocab_hash": "sha256:other"}
    write(tmp_path, artifact(llada_tok, kind="calibrated", model="tiny-llada", tokenizer=other), "1.json")
    write(tmp_path, artifact(llada_tok, kind="heuristic", model="GSAI-ML/LLaDA-8B-Instruct",
                             tokenizer={"name": "x", "vocab_hash": None}), "2.json")
    write(tmp_path, artifact(llada_tok, kind="online", model="mine"), "3.json")
    assert pick_artifact("llada", "math-word", "mine", llada_tok)["_path"].endswith("2.json")
    assert pick_artifact("llada", "math-word", "/models/llada-8b-instruct/", llada_tok)["_why"] == \
        "built for this model"
    write(tmp_path, artifact(llada_tok, kind="hand-written", model="h"), "4.json")   # same hash
    with caplog.at_level("WARNING", logger="pvf_lmeval"):
        _, source = resolve_vocab("auto", tokenizer=llada_tok, model_family="llada",
                                  model_name="GSAI-ML/LLaDA-8B-Instruct", task_family="math-word")
    assert source.endswith("4.json") and "picked 4.json (hand-written, built with this tokenizer" \
        in caplog.text
    write(tmp_path, artifact(llada_tok, kind="calibrated", model="c", tokens=()), "5.json")
    assert pick_artifact("llada", "math-word", "x", llada_tok)["_path"].endswith("4.json")  # empty: skipped
    write(tmp_path, artifact(llada_tok, kind="calibrated", model="c"), "6.json")     # same hash
    assert pick_artifact("llada", "math-word", "x", llada_tok)["_path"].endswith("6.json")


def test_auto_skips_an_artifact_calibrated_on_other_weights(llada_tok, tmp_path, monkeypatch, caplog):
    """A calibrated artifact records the weights fingerprint of the checkpoint it was measured
    on; for a retrained or fine-tuned checkpoint with the same tokenizer vocab=auto skips it, says
    so, and picks the next best; an explicit path still uses it."""
    monkeypatch.setattr("pvf_lmeval.planning.vocab.vocab_artifacts_dir", lambda: tmp_path)
    write(tmp_path, artifact(llada_tok, kind="hand-written", model="h"), "1.json")
    write(tmp_path, artifact(llada_tok, kind="calibrated", model="c", model_weights="sha256:old"),
          "2.json")
    for weights in ("sha256:old", None):      # the same weights, or a model built in memory
        assert pick_artifact("llada", "math-word", "x", llada_tok, weights)["_path"].endswith("2.json")
    with caplog.at_level("WARNING", logger="pvf_lmeval"):
        _, source = resolve_vocab("auto", tokenizer=llada_tok, model_family="llada",
                                  task_family="math-word", weights="sha256:new")
    assert source.endswith("1.json")
    assert "skipped 2.json: calibrated on other weights than the loaded checkpoint's" in caplog.text
    # the same through a loaded model, which carries its own fingerprint
    model = SimpleNamespace(tokenizer=llada_tok, family="llada", name="x", weights_fingerprint="sha256:new")
    assert resolve_vocab_for(model, task_family="math-word")[1].endswith("1.json")
    model.weights_fingerprint = "sha256:old"
    assert resolve_vocab_for(model, task_family="math-word")[1].endswith("2.json")
    _, source = resolve_vocab(str(tmp_path / "2.json"), tokenizer=llada_tok, model_family="llada")
    assert source.endswith("2.json")
    # an artifact that records no fingerprint (written before it was recorded) is not skipped
    write(tmp_path, artifact(llada_tok, kind="calibrated", model="c"), "3.json")
    assert pick_artifact("llada", "math-word", "x", llada_tok, "sha256:new")["_path"].endswith("3.json")


def test_shipped_heuristic_artifacts_resolve_by_string(llada_tok, dream_tok, caplog):
    from pvf_lmeval.files.paths import vocab_artifacts_dir

    for fam, stem, tok in (("llada", "llada-8b-instruct", llada_tok),
                           ("dream", "dream-v0-instruct-7b", dream_tok)):
        for task in ("math-word", "knowledge", "code", "math"):
            art = load_artifact(vocab_artifacts_dir() / f"{stem}.{task}.heuristic.json")
            assert art["kind"] == "heuristic" and art["calibrated"] is False
            assert "UNCALIBRATED" in art["note"] and art["calibrate_command"].startswith("pvf-calibrate ")
            assert all(t["id"] is None for t in art["tokens"])
            with caplog.at_level("WARNING", logger="pvf_lmeval"):
                ids = resolve_artifact(art, tok, fam)       # by string, misses warned about
            vocab = tok.get_vocab()
            strings = [t["string"] for t in art["tokens"]]
            # exactly the artifact's strings that this tokenizer has ("=" is not a knowledge token)
            assert set(ids) == {vocab[s] for s in strings if s in vocab}
            assert (vocab["Ġ="] in ids) == (task != "knowledge")
        _, source = resolve_vocab("auto", tokenizer=tok, model_family=fam,
                                  model_name=f"/ckpt/{stem}", task_family="code")
        assert source.endswith(f"{stem}.code.heuristic.json")


def test_resolution_by_id_when_hash_matches_else_by_string(tmp_path, llada_tok):
    data = artifact(llada_tok)
    want = tuple(sorted(llada_tok.get_vocab()[t] for t in ("ĠStep", "Ġ=")))
    assert resolve_artifact(load_artifact(write(tmp_path, data)), llada_tok, "llada") == want
    data["tokens"][0]["id"] = 3  # a stale id: the hash's claim is checked, not trusted
    with pytest.raises(ValueError, match="id 3 is .* in this tokenizer, not 'ĠStep' as the artifact says"):
        resolve_artifact(load_artifact(write(tmp_path, data)), llada_tok, "llada")
    data["tokenizer"]["vocab_hash"] = "sha256:other"
    ids = resolve_artifact(load_artifact(write(tmp_path, data)), llada_tok, "llada")
    assert ids == tuple(sorted(llada_tok.get_vocab()[t] for t in ("ĠStep", "Ġ=")))


def test_string_resolution_warns_about_unknown_tokens(tmp_path, llada_tok, caplog):
    data = artifact(llada_tok, tokens=("ĠStep", "Ġnot_a_token_here"))
    data["tokenizer"]["vocab_hash"] = "sha256:other"
    with caplog.at_level("WARNING", logger="pvf_lmeval"):
        ids = resolve_artifact(load_artifact(write(tmp_path, data)), llada_tok, "llada")
    assert ids == (llada_tok.get_vocab()["ĠStep"],)
    assert "Ġnot_a_token_here" in caplog.text


def test_other_model_family_is_an_error_unless_forced(tmp_path, llada_tok, dream_tok):
    path = write(tmp_path, artifact(llada_tok, family="llada"))
    with pytest.raises(ValueError, match="model family 'llada'.*loaded model is 'dream'"):
        resolve_vocab(str(path), tokenizer=dream_tok, model_family="dream")
    ids, _ = resolve_vocab(str(path), tokenizer=dream_tok, model_family="dream", force=True)
    assert dream_tok.get_vocab()["ĠStep"] in ids


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format_version=7), "format_version=7"),
    (lambda d: d.update(kind="guess"), "kind='guess'"),
    (lambda d: d.update(task_family="poetry"), "task_family='poetry'"),
    (lambda d: d.update(tokens="ĠStep"), "'tokens' must be a list"),
])
def test_bad_artifacts_name_file_and_problem(tmp_path, llada_tok, mutate, message):
    data = artifact(llada_tok)
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ValueError, match=message) as err:
        load_artifact(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_unreadable_artifact(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json: unreadable"):
        load_artifact(path)


def test_python_collections(llada_tok):
    vocab = llada_tok.get_vocab()
    assert resolve_vocab(["ĠStep", "Ġ="], tokenizer=llada_tok, model_family="llada")[0] == \
        tuple(sorted((vocab["ĠStep"], vocab["Ġ="])))
    assert resolve_vocab([5, 3, 5], tokenizer=llada_tok, model_family="llada")[0] == (3, 5)
    with pytest.raises(ValueError, match=r"vocab: tokens \['Step!!'\] are not in this tokenizer"):
        resolve_vocab(["Step!!"], tokenizer=llada_tok, model_family="llada")
    with pytest.raises(ValueError, match="outside this tokenizer"):
        resolve_vocab([10**6], tokenizer=llada_tok, model_family="llada")
    with pytest.raises(ValueError, match="vocab='nope' is not auto, none"):
        resolve_vocab("nope", tokenizer=llada_tok, model_family="llada")
    assert resolve_vocab("none", tokenizer=llada_tok, model_family="llada") == (None, "none")
