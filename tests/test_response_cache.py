"""``--use_cache`` files as an attacker or a careless user leaves them (docs/security.md, "lm-eval's
response cache"): a planted pickle runs nothing, and a cache answers a run only with answers of
the same weights, tokenizer, per-task decoding and, where answers drew, seed.

lm-eval's ``CachingLM`` stores each answer pickled in an SQLite file named ``<path>_rank0.db``
and keys it by the request alone; pvf-dlm's records live in a JSON table of their own."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.prerequisites import require_bundled_weights

REPO = Path(__file__).resolve().parents[1]


class _Planted:
    """A pickle whose loading runs code that creates ``marker``: what a hostile cache row
    carries (``pickle.loads`` calls ``exec``)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)


def _fixture_copy(dst: Path) -> Path:
    import shutil

    from pvf_lmeval.models.loader import FIXTURES_DIR

    require_bundled_weights("tiny-llada")
    return Path(shutil.copytree(FIXTURES_DIR / "tiny-llada", dst))


def _lm(pretrained="tiny-llada", **kw):
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    return PVFDiffusionLM(pretrained=str(pretrained), device="cpu", gen_length=32, **kw)


def _evaluate(lm, task_manager, cache, limit=2, **kw):
    from lm_eval import simple_evaluate

    return simple_evaluate(model=lm, tasks=["arith"], limit=limit, task_manager=task_manager,
                           bootstrap_iters=0, use_cache=str(cache), **kw)


def _refused(lm, task_manager, cache, **kw) -> str:
    with pytest.raises(ValueError) as exc:
        _evaluate(lm, task_manager, cache, **kw)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"pvf-dlm: --use_cache {cache}_rank0.db "), msg
    return msg


def _plant_rows(db: Path, value: bytes) -> int:
    """Replace every answer of lm-eval's table in ``db`` by ``value``; returns how many."""
    with sqlite3.connect(db) as conn:
        return conn.execute('UPDATE "unnamed" SET value = ?', (value,)).rowcount


def _answers(results) -> list[str]:
    return [s["resps"][0][0] for s in results["samples"]["arith"]]


# ----------------------------------------------------------------------------- planted pickles


def test_an_old_pickled_identity_row_is_refused_unread(task_manager, tmp_path):
    """pvf-lmeval once kept its identity as a pickled row under a fixed key, which made reading
    it unconditional: such a file is refused by a key look-up, its row never loaded."""
    from sqlitedict import SqliteDict

    marker = tmp_path / "ran"
    cache = tmp_path / "answers"
    with SqliteDict(f"{cache}_rank0.db", autocommit=True) as db:
        db["pvf-dlm/decoding-identity"] = _Planted(marker)
    msg = _refused(_lm(), task_manager, cache)
    assert "older pvf-lmeval" in msg and "remove that file" in msg
    assert not marker.exists()


def test_a_planted_answer_row_runs_nothing(task_manager, tmp_path):
    """A cache made by a real run, then each answer replaced by a pickle that runs code when
    loaded: the rerun stops at the first row it reads, in one line naming the file."""
    marker = tmp_path / "ran"
    cache = tmp_path / "answers"
    _evaluate(_lm(), task_manager, cache)
    assert _plant_rows(Path(f"{cache}_rank0.db"), pickle.dumps(_Planted(marker))) == 2
    msg = _refused(_lm(), task_manager, cache)
    assert "holds an answer row that is not an answer (it names builtins.exec)" in msg
    assert not marker.exists()


def test_the_cli_stops_at_a_planted_row_in_one_line(task_manager, tmp_path):
    """The stock CLI on a shared cache file: exit status 1, one line, nothing run."""
    marker = tmp_path / "ran"
    cache = tmp_path / "answers"
    _evaluate(_lm(), task_manager, cache, limit=1)
    _plant_rows(Path(f"{cache}_rank0.db"), pickle.dumps(_Planted(marker)))
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "pvf-dlm", "--model_args",
         "pretrained=tiny-llada,gen_length=32", "--device", "cpu",
         "--include_path", str(REPO / "tasks"), "--tasks", "arith", "--limit", "1",
         "--use_cache", str(cache)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"pvf-dlm: --use_cache {cache}_rank0.db holds an answer row that is not an answer")
    assert not marker.exists()


# ----------------------------------------------------------------------------- read_answer


def _text(meta=None, task="arith"):
    from pvf_lmeval.lmeval.generation import GenerationText
    from pvf_lmeval.lmeval.stats import MEAN_KEYS

    return GenerationText("#### 4", {**{k: 1.0 for k in MEAN_KEYS}, **(meta or {})}, task)


@pytest.mark.parametrize("answer", ["#### 4", -1.25, (-3.5, True), (0, False)],
                         ids=["text", "rolling", "likelihood", "likelihood-int"])
def test_lm_evals_answers_read_back_as_written(answer):
    from pvf_lmeval.lmeval.response_cache import read_answer

    assert read_answer(pickle.dumps(answer)) == answer


def test_a_generation_text_reads_back_with_its_statistics_and_task():
    from pvf_lmeval.lmeval.generation import GenerationText
    from pvf_lmeval.lmeval.response_cache import read_answer

    text = _text({"routes": [1, 2]})
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = read_answer(pickle.dumps(text, protocol=protocol))
        assert type(back) is GenerationText and back == text
        assert back.meta == text.meta and back.task == "arith"


def _os_system_pickle() -> bytes:
    # protocol 0: GLOBAL 'os system', as hand-written exploits do
    return b"cos\nsystem\n(S'true'\ntR."


@pytest.mark.parametrize("blob, why", [
    (_os_system_pickle(), "it names os.system"),
    (pickle.dumps(_Planted(Path("/nonexistent/x"))), "it names builtins.exec"),
    (pickle.dumps({1, 2}), "it holds a set, not an answer"),
    (pickle.dumps({"a": 1}), "it holds a dict, not an answer"),
    (pickle.dumps((1.0, 2.0)), "it holds a tuple, not an answer"),
    (pickle.dumps(_text({"nfe": "3"})), "its statistic nfe is '3', not a finite count"),
    (pickle.dumps(_text({"nfe": float("nan")})), "its statistic nfe is nan, not a finite count"),
    (pickle.dumps(_text({"wall_s": -1.0})), "its statistic wall_s is -1.0, not a finite count"),
    (pickle.dumps(_text({"nfe": True})), "its statistic nfe is True, not a finite count"),
    (pickle.dumps(_text(task=3)), "its statistics are not a dict with a task name"),
    (pickle.dumps(_text({"x": {1: 2}})), "a statistics key is not a string"),
    (b"\x80\x04\x95", "it is not a readable answer (UnpicklingError)"),
    (b"garbage", "it is not a readable answer"),
], ids=["os.system", "exec", "set", "dict", "pair-of-floats", "string-stat", "nan-stat",
        "negative-stat", "bool-stat", "task-not-str", "int-key", "truncated", "garbage"])
def test_anything_but_an_answer_is_refused(blob, why):
    from pvf_lmeval.lmeval.response_cache import UntrustedCacheRow, read_answer

    with pytest.raises(UntrustedCacheRow) as exc:
        read_answer(blob)
    assert str(exc.value).startswith(why)


def test_the_answer_check_bounds_depth_and_values_exactly():
    """Statistics are depth 1, their values depth 2: lists or dicts down to depth 4 are read, one
    level more is refused; 10,000 values in all are read, one more is refused."""
    from pvf_lmeval.lmeval.response_cache import UntrustedCacheRow, read_answer

    for deepest in ([[1]], {"b": {"c": 1}}, [{"c": 1}], {"b": [1]}):
        assert read_answer(pickle.dumps(_text({"x": deepest}))).meta["x"] == deepest
    for too_deep in ([[[1]]], {"b": {"c": {"d": 1}}}, [{"c": [1]}], {"b": [[1]]}):
        with pytest.raises(UntrustedCacheRow, match="deeper or holds more values"):
            read_answer(pickle.dumps(_text({"x": too_deep})))
    stats = len(_text().meta)                  # the meta dict itself is one value too
    assert read_answer(pickle.dumps(_text({"x": [0] * (10_000 - stats - 2)})))
    with pytest.raises(UntrustedCacheRow, match="deeper or holds more values"):
        read_answer(pickle.dumps(_text({"x": [0] * (10_000 - stats - 1)})))


def test_a_row_built_to_explode_the_check_is_refused():
    """Shared references make a small pickle of a huge tree (each list holds the one before it
    twice): the check counts values, so it stops instead of walking 2^40 of them."""
    from pvf_lmeval.lmeval.response_cache import UntrustedCacheRow, read_answer

    tree: list = []
    for _ in range(40):
        tree = [tree, tree]
    blob = pickle.dumps(_text({"tree": tree}))
    assert len(blob) < 2000
    with pytest.raises(UntrustedCacheRow, match="deeper or holds more values"):
        read_answer(blob)


@settings(max_examples=300, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200) | st.builds(lambda b, cut: b[:cut], st.sampled_from([
    pickle.dumps(_text()), pickle.dumps((-1.5, True)), _os_system_pickle(),
    pickle.dumps(_Planted(Path("/nonexistent/x")))]), st.integers(0, 400)))
def test_no_bytes_make_read_answer_look_anything_up(blob):
    """Any bytes (random, or a cut of a real or hostile row): the answer types come back, or
    UntrustedCacheRow; no class or function but GenerationText is ever looked up."""
    from pvf_lmeval.lmeval import response_cache
    from pvf_lmeval.lmeval.generation import GenerationText

    looked_up = []
    real = response_cache._AnswerUnpickler.find_class

    def spy(self, module, name):
        looked_up.append((module, name))
        return real(self, module, name)

    response_cache._AnswerUnpickler.find_class = spy
    try:
        value = response_cache.read_answer(blob)
    except response_cache.UntrustedCacheRow:
        value = None
    finally:
        response_cache._AnswerUnpickler.find_class = real
    assert value is None or type(value) in (GenerationText, str, float, int, tuple)
    allowed = (GenerationText.__module__, "GenerationText")
    assert all(m == allowed for m in looked_up[:-1])   # the last may be the refused one


# ----------------------------------------------------------------------------- what answers depend on


def test_the_identity_record_is_json_read_with_sql(task_manager, tmp_path):
    cache = tmp_path / "answers"
    lm = _lm()
    _evaluate(lm, task_manager, cache)
    with sqlite3.connect(f"{cache}_rank0.db") as conn:
        rows = dict(conn.execute('SELECT name, value FROM "pvf_dlm"').fetchall())
    identity = json.loads(rows["identity"])
    assert identity["weights"] == lm.model.weights_fingerprint
    assert identity["tokenizer_hash"].startswith("sha256:") and "seed" not in identity
    assert identity["decoder"] == "threshold" and identity["mc_num"] == 128
    assert json.loads(rows["task.arith"]) == {"block_length": 32, "cache": "none",
                                              "early_stop": True, "gen_length": 32,
                                              "rules": "paper", "temperature": 0,
                                              "threshold": 0.9}
    assert "seed.generation" not in rows        # a greedy decode draws nothing


def test_retrained_weights_at_the_same_path_refuse_the_cache(task_manager, tmp_path):
    """Retrain, overwrite the folder, rerun: the old answers must not come back."""
    from safetensors.torch import load_file, save_file

    folder = _fixture_copy(tmp_path / "model")
    cache = tmp_path / "answers"
    made = _lm(folder)
    _evaluate(made, task_manager, cache)
    weights = load_file(folder / "model.safetensors")
    save_file({k: v * (1 + 1e-3) if v.is_floating_point() else v for k, v in weights.items()},
              folder / "model.safetensors", metadata={"format": "pt"})
    again = _lm(folder)
    assert again.model.weights_fingerprint != made.model.weights_fingerprint
    msg = _refused(again, task_manager, cache)
    assert f"weights: {made.model.weights_fingerprint} -> {again.model.weights_fingerprint}" in msg


def test_another_tokenizer_at_the_same_path_refuses_the_cache(task_manager, tmp_path):
    folder = _fixture_copy(tmp_path / "model")
    cache = tmp_path / "answers"
    _evaluate(_lm(folder), task_manager, cache)
    tok = json.loads((folder / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        if added["content"] == "<|start_header_id|>":
            added["content"] = "<|start_of_header|>"
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    msg = _refused(_lm(folder), task_manager, cache)
    assert "tokenizer_hash: sha256:" in msg


def test_a_greedy_cache_serves_any_seed_and_one_that_drew_only_its_own(task_manager, tmp_path):
    """A greedy decode draws nothing, so lm-eval's --seed cannot change an answer and a run of
    another seed reads the cache. ``explore`` draws its pick (at temperature 0 too): its
    answers are the seed's own, and a run of another seed is refused."""
    greedy = tmp_path / "greedy"
    made = _evaluate(_lm(), task_manager, greedy, torch_random_seed=0)
    lm = _lm()
    calls = []
    real = lm.model.logits
    lm.model.logits = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    again = _evaluate(lm, task_manager, greedy, torch_random_seed=9)
    assert calls == [] and _answers(again) == _answers(made)

    drawn = tmp_path / "drawn"
    made = _evaluate(_lm(decoder="explore"), task_manager, drawn, torch_random_seed=0)
    msg = _refused(_lm(decoder="explore"), task_manager, drawn, torch_random_seed=9)
    assert "holds generation answers drawn with seed 0 and this run draws with seed 9" in msg
    again = _evaluate(_lm(decoder="explore"), task_manager, drawn, torch_random_seed=0)
    assert _answers(again) == _answers(made)


def test_a_task_decoded_under_another_preset_refuses_the_cache(task_manager, tmp_path):
    """``arith`` decodes with its preset (reveal_next 5) unless ``preset=none`` turns task
    presets off: the run identities are equal, the answers are not."""
    cache = tmp_path / "answers"
    _evaluate(_lm(decoder="pvf", preset="none"), task_manager, cache)
    msg = _refused(_lm(decoder="pvf"), task_manager, cache)
    assert "holds answers of task arith decoded otherwise (reveal_next: 0 -> 5: cached -> this run)" in msg


def test_the_likelihood_estimator_enters_the_cache_identity_where_chosen():
    """An answer scored with LLaDA's mask counts (mc_stratum) or softmax (mask_logit=kept) is
    another answer: the cache identity holds each where a run chose it, and stays that of the
    defaults otherwise (caches written before these settings existed still serve)."""
    from pvf_lmeval.lmeval.response_cache import cache_identity

    def ident(**likelihood):
        info = {"pretrained": "m", "decoder": "threshold", "params": {"gen_length": 32},
                "likelihood": {"mc_num": 8, "mc_stratum": None, "mask_logit": "excluded",
                               **likelihood}}
        return cache_identity(info, 8, weights="w", tokenizer_hash="t")

    base = ident()
    assert "mc_stratum" not in base and "mask_logit" not in base
    assert ident(mask_logit="kept") == {**base, "mask_logit": "kept"}
    assert ident(mc_stratum=8) == {**base, "mc_stratum": 8}
