"""Bundled tasks run with their PVF preset (``lmeval/task_presets.py``) unless ``preset`` is
given: in the model args (wins, ``preset=none`` turns presets off) or in the request's
generation kwargs. Through the real CLI: ``decoder=pvf`` alone on ``arith_var`` decodes exactly
as ``decoder=pvf,preset=arith`` and not as ``preset=none``."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL = "tiny-llada"
KWARGS = {"until": ["Question:"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 256}


def _lm(model_args: str):
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    return PVFDiffusionLM.create_from_arg_string(model_args, {"device": "cpu"})


@pytest.fixture(scope="module")
def pvf_lm():
    return _lm(f"pretrained={MODEL},decoder=pvf")


def _band(params) -> tuple:
    return (params.preset, params.plan_lo, params.plan_hi, params.ar_lo, params.reveal_next)


def test_the_task_selects_the_preset(pvf_lm):
    # SPEC paper table: math-word 0.2-0.65, ar_lo 0.1, N_s 5; code 0.8-0.9, ar_lo 0.3, N_s 0
    assert _band(pvf_lm.params) == (None, 0.2, 0.65, 0.1, 0)
    assert _band(pvf_lm.planner.request_params(dict(KWARGS), "arith_var")[0]) == ("arith", 0.2, 0.65, 0.1, 5)
    assert _band(pvf_lm.planner.request_params(dict(KWARGS), "humaneval_pvf")[0]) == ("humaneval", 0.8, 0.9, 0.3, 0)
    # lm-eval's built-in that gsm8k_pvf replicates decodes as gsm8k_pvf does; another task not
    assert _band(pvf_lm.planner.request_params(dict(KWARGS), "gsm8k")[0]) == ("gsm8k", 0.2, 0.65, 0.1, 5)
    assert _band(pvf_lm.planner.request_params(dict(KWARGS), "my_gsm8k")[0]) == (None, 0.2, 0.65, 0.1, 0)
    # a preset in the generation kwargs (a task's YAML or --gen_kwargs) wins over the table
    got = pvf_lm.planner.request_params({**KWARGS, "preset": "math"}, "arith_var")[0]
    assert _band(got) == ("math", 0.8, 0.9, 0.3, 0)
    # --gen_kwargs preset=none (lm-eval parses none as None) turns the task's preset off
    got = pvf_lm.planner.request_params({**KWARGS, "preset": None}, "arith_var")[0]
    assert _band(got) == (None, 0.2, 0.65, 0.1, 0)
    assert pvf_lm.planner.tasks.presets == {"arith_var": "math", "humaneval_pvf": "humaneval",
                                   "gsm8k": "gsm8k"}


def test_a_preset_model_arg_wins_and_none_turns_presets_off():
    lm = _lm(f"pretrained={MODEL},decoder=pvf,preset=humaneval,plan_lo=0.5")
    got = lm.planner.request_params({**KWARGS, "preset": "gsm8k"}, "arith_var")[0]
    assert _band(got) == ("humaneval", 0.5, 0.9, 0.3, 0)
    off = _lm(f"pretrained={MODEL},decoder=pvf,preset=none")
    assert _band(off.planner.request_params(dict(KWARGS), "arith_var")[0]) == (None, 0.2, 0.65, 0.1, 0)
    assert off.planner.tasks.presets == {}


def test_explicit_model_args_stay_under_a_task_preset(pvf_lm):
    lm = _lm(f"pretrained={MODEL},decoder=pvf,reveal_next=2,threshold=0.8")
    got = lm.planner.request_params(dict(KWARGS), "mmlu_pro_pvf")[0]
    assert (got.preset, got.reveal_next, got.threshold, got.plan_hi) == ("mmlu_pro", 2, 0.8, 0.65)


#: the bundled likelihood tasks: nothing is decoded for them, so no preset applies
LIKELIHOOD_TASKS = {"gpqa_main_n_shot_llada"}


def _bundled_tasks() -> dict[str, Path]:
    """The bundled generation tasks (every bundled task but the likelihood ones; a group's
    ``task:`` list names tasks of their own files)."""
    tasks = {line.split(":", 1)[1].strip(): f for f in (REPO / "tasks").glob("*/*.yaml")
             for line in f.read_text().splitlines() if line.startswith("task: ")}
    assert LIKELIHOOD_TASKS <= set(tasks)
    for name in LIKELIHOOD_TASKS:
        assert "output_type: multiple_choice" in tasks.pop(name).read_text()
    return tasks


def test_every_bundled_task_has_a_preset():
    from pvf_lmeval.decoding.params import PRESETS
    from pvf_lmeval.lmeval.task_presets import TASK_PRESETS

    assert set(_bundled_tasks()) <= set(TASK_PRESETS)
    assert set(TASK_PRESETS.values()) <= set(PRESETS)


def _builtin_tasks(name: str) -> list[str]:
    """The tasks of lm-eval's installed task (or group) ``name``, from its YAML files."""
    import lm_eval.tasks

    found = []
    for f in Path(lm_eval.tasks.__file__).parent.rglob("*.yaml"):
        lines = f.read_text(errors="replace").splitlines()
        if f"task: {name}" in lines or f"task: \"{name}\"" in lines:
            found.append(name)
        elif f"group: {name}" in lines:
            start = lines.index("task:")
            for line in lines[start + 1:]:
                if not line.startswith("  - "):
                    break
                found.append(line[4:].strip())
    return sorted(set(found))


def test_a_builtin_task_and_its_bundled_replica_share_a_preset():
    """A bundled task whose YAML opens with "lm-eval's `X`" asks X's prompts with X's generation
    kwargs: lm-eval's --use_cache cannot tell their answers apart, so they must decode alike.
    Every task ``TASK_PRESETS`` names is bundled or such a built-in."""
    import re

    from pvf_lmeval.lmeval.task_presets import TASK_PRESETS, task_preset

    replicated = set()
    for task, path in _bundled_tasks().items():
        first = path.read_text().splitlines()[0]
        named = re.match(r"# lm-eval's (?:built-in )?`([a-z0-9_]+)`", first)
        if named is None:
            continue
        builtins = _builtin_tasks(named.group(1))
        assert builtins, f"{path.name} names lm-eval's {named.group(1)}, which is not installed"
        for builtin in builtins:
            assert task_preset(builtin) == task_preset(task), (builtin, task)
        replicated |= set(builtins)
    assert len(replicated) == 20            # gsm8k, gsm8k_cot, humaneval(_instruct), 14 + 1 math, mbpp
    assert set(TASK_PRESETS) == set(_bundled_tasks()) | replicated


# ------------------------------------------------------------------ through the CLI

@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("task_presets")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    jobs = {"task": "", "explicit": ",preset=arith", "none": ",preset=none"}

    def run(item):
        name, extra = item
        out = root / name
        cmd = [str(BIN / "lm_eval"), "--model", "pvf-dlm", "--model_args",
               f"pretrained={MODEL},decoder=pvf{extra}", "--device", "cpu",
               "--include_path", str(REPO / "tasks"), "--tasks", "arith_var", "--limit", "2",
               "--output_path", str(out), "--log_samples"]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-3000:]}"
        (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
        (smp,) = glob.glob(str(out / "**" / "samples_arith_var_*.jsonl"), recursive=True)
        rows = [json.loads(line) for line in Path(smp).read_text().splitlines() if line.strip()]
        samples = [(r["doc_id"], r["resps"], r["nfe"]) for r in sorted(rows, key=lambda r: r["doc_id"])]
        return name, (json.loads(Path(res).read_text())["config"]["pvf"], samples)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, jobs.items()))


def test_the_cli_decodes_arith_var_with_the_arith_preset(cli_runs):
    task, explicit, none = (cli_runs[k] for k in ("task", "explicit", "none"))
    assert task[0]["task_presets"] == {"arith_var": "arith"}
    assert explicit[0]["task_presets"] == {} and none[0]["task_presets"] == {}
    assert task[1] == explicit[1]
    assert [nfe for _, _, nfe in task[1]] != [nfe for _, _, nfe in none[1]]
