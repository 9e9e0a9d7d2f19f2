"""lm-eval's habits through its Python API (``simple_evaluate``, as the CLI calls it): ``--seed``,
``--use_cache`` and one model instance serving several evaluations. Each test names what HFLM
(``lm_eval/models/huggingface.py``) or lm-eval's evaluator does where pvf-dlm follows it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.prerequisites import require_bundled_weights

REPO = Path(__file__).resolve().parents[1]
SAMPLING = {"do_sample": True, "temperature": 0.8}


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)


def _lm(**kw):
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    return PVFDiffusionLM(pretrained="tiny-llada", device="cpu", gen_length=32, **kw)


def _evaluate(lm, task_manager, limit=2, **kw):
    from lm_eval import simple_evaluate

    return simple_evaluate(model=lm, tasks=["arith"], limit=limit, task_manager=task_manager,
                           bootstrap_iters=0, **kw)


def _answers(results) -> list[tuple[str, dict]]:
    return [(s["resps"][0][0], s["resps"][0][0].meta) for s in results["samples"]["arith"]]


@pytest.fixture(scope="module")
def sampler():
    return _lm(batch_size=2, batch_invariant=True)


def test_sampling_follows_lm_evals_seed(sampler, task_manager):
    """HFLM samples from torch's global generator, which ``simple_evaluate`` seeds with
    ``torch_random_seed`` (the third value of ``--seed``): another ``--seed``, other samples.
    Without a ``seed`` model arg pvf-dlm seeds each request's generator from that seed: the
    same seed reproduces the samples bit for bit, whatever the batch."""
    runs = {seed: _evaluate(sampler, task_manager, gen_kwargs=SAMPLING, torch_random_seed=seed)
            for seed in (0, 9)}
    again = _evaluate(sampler, task_manager, gen_kwargs=SAMPLING, torch_random_seed=9)
    assert _answers(runs[0]) != _answers(runs[9])
    assert [(t, m["nfe"]) for t, m in _answers(again)] == \
        [(t, m["nfe"]) for t, m in _answers(runs[9])]
    pvf = again["config"]["pvf"]
    assert pvf["params"]["seed"] == 9 and pvf["seed_from"] == "lm-eval --seed (torch's seed)"
    # one request per batch: the same samples (each request draws from its own generator)
    alone = _evaluate(_lm(batch_size=1, batch_invariant=True), task_manager, gen_kwargs=SAMPLING,
                      torch_random_seed=9)
    assert [(t, m["nfe"]) for t, m in _answers(alone)] == \
        [(t, m["nfe"]) for t, m in _answers(runs[9])]


def test_a_seed_model_arg_wins_over_lm_evals_seed(task_manager):
    lm = _lm(seed=5)
    a, b = (_evaluate(lm, task_manager, limit=1, gen_kwargs=SAMPLING, torch_random_seed=s)
            for s in (0, 9))
    assert [t for t, _ in _answers(a)] == [t for t, _ in _answers(b)]
    assert b["config"]["pvf"]["params"]["seed"] == 5 and b["config"]["pvf"]["seed_from"] == \
        "seed model arg"


def test_each_evaluation_reports_its_own_requests(task_manager):
    """lm-eval's evaluator asks ``get_model_info`` once per ``simple_evaluate``, at its end, and
    merges it into that evaluation's ``config``: one model instance serving two evaluations
    reports each one's requests, not their sum."""
    lm = _lm()
    first = _evaluate(lm, task_manager, limit=2)
    second = _evaluate(lm, task_manager, limit=3)
    assert first["config"]["pvf"]["totals"]["arith"]["requests"] == 2
    assert second["config"]["pvf"]["totals"]["arith"]["requests"] == 3
    nfe = [m["nfe"] for _, m in _answers(second)]
    assert second["config"]["pvf"]["totals"]["arith"]["nfe_total"] == sum(nfe)


def test_use_cache_answers_one_decoding_and_keeps_its_costs(task_manager, tmp_path):
    """lm-eval's ``CachingLM`` keys an answer by the request alone (``hash_args(attr,
    req.args)``), not the model args, for HFLM too. pvf-dlm records its decoding identity in the
    database: a run of another decoder on the same path is refused before any request, and a
    run answered from the cache reports the costs of the run that made the answers."""
    cache = str(tmp_path / "answers")
    made = _evaluate(_lm(), task_manager, limit=3, use_cache=cache)
    lm = _lm()
    calls = []
    real = lm.model.logits
    lm.model.logits = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    again = _evaluate(lm, task_manager, limit=3, use_cache=cache)
    assert calls == []                                    # every answer came from the cache
    assert _answers(again) == _answers(made)
    costs = {k: v for k, v in made["config"]["pvf"]["totals"]["arith"].items()
             if k not in ("from_cache", "wall_s", "tps")}
    totals = again["config"]["pvf"]["totals"]["arith"]
    assert {k: v for k, v in totals.items() if k in costs} == costs and totals["from_cache"] == 3
    assert made["config"]["pvf"]["totals"]["arith"]["from_cache"] == 0
    with pytest.raises(ValueError) as exc:
        _evaluate(_lm(decoder="static"), task_manager, limit=3, use_cache=cache)
    msg = str(exc.value)
    assert "\n" not in msg and f"--use_cache {cache}_rank0.db" in msg
    assert "decoder: threshold -> static" in msg


def test_the_cli_refuses_another_decodings_cache_in_one_line(task_manager, tmp_path):
    """The stock CLI: ``--use_cache`` written by ``decoder=threshold``, read by
    ``decoder=static``: one line naming what differs, no traceback, exit status 1."""
    cache = str(tmp_path / "answers")
    _evaluate(_lm(), task_manager, limit=1, use_cache=cache)
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "pvf-dlm", "--model_args",
         "pretrained=tiny-llada,gen_length=32,decoder=static", "--device", "cpu",
         "--include_path", str(REPO / "tasks"), "--tasks", "arith", "--limit", "1",
         "--use_cache", cache], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pvf-dlm: --use_cache {cache}_rank0.db holds the answers of another "
                           "decoding (decoder: threshold -> static")


def test_the_readme_python_example_runs(tmp_path):
    """The README's Python block as a user runs it (its ``limit=20`` cut to 2): ``decode``
    prints the solution, 3 calls and 16.7 tokens per call; ``simple_evaluate`` finds the
    package's tasks through ``pvf_lmeval.tasks_path()`` and reports accuracy and mean NFE."""
    import os
    import re

    readme = (REPO / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "simple_evaluate" in b]
    assert "limit=20" in block
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", block.replace("limit=20", "limit=2")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[4].startswith("#### 4 3 16.66"), lines
    accuracy, nfe = map(float, lines[-1].split())
    assert 0 <= accuracy <= 1 and nfe > 1
