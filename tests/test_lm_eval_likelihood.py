"""lm-eval's likelihood habits and generation limits through real ``lm_eval`` processes, on the
bundled tiny-llada, offline, with the tasks of ``tests/likelihood_tasks`` (``arith_choice``:
``multiple_choice``; ``arith_greedy``: ``output_type: loglikelihood`` whose ``acc`` is
``is_greedy``, as lambada's).

They pin: a multiple-choice task runs no greedy check (is_greedy False, one model call per
continuation); a loglikelihood task's ``acc`` is LLaDA's suffix greedy prediction, its calls in
the totals; the likelihood costs in ``config.pvf.totals`` and in the samples; the likelihood
settings (``cfg_scale``, ``mc_stratum``, ``mask_logit``) in ``config.pvf.likelihood``;
``max_gen_toks`` caps the answer's tokens on a longer canvas; ``do_sample=true`` without a
temperature and ``batch_size`` given twice are one-line errors.
"""

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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TASKS = REPO / "tests" / "likelihood_tasks"
LIMIT = 4


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONWARNINGS": "ignore"}


def _cmd(model_args: str, out: Path, tasks: str, include: Path, *extra: str) -> list[str]:
    return [str(BIN / "lm_eval"), "--model", "pvf-dlm", "--model_args", model_args,
            "--device", "cpu", "--include_path", str(include), "--tasks", tasks,
            "--limit", str(LIMIT), "--output_path", str(out), "--log_samples", *extra]


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, out: Path):
        self.proc, self.out = proc, out

    def ok(self) -> "Run":
        assert self.proc.returncode == 0, self.proc.stderr[-4000:]
        return self

    @property
    def results(self) -> dict:
        (path,) = glob.glob(str(self.out / "**" / "results_*.json"), recursive=True)
        return json.loads(Path(path).read_text())

    def samples(self, task: str) -> list[dict]:
        (path,) = glob.glob(str(self.out / "**" / f"samples_{task}_*.jsonl"), recursive=True)
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        return sorted(rows, key=lambda r: r["doc_id"])

    @property
    def last_line(self) -> str:
        return self.proc.stderr.rstrip("\n").rsplit("\n", 1)[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("lm_eval_likelihood")
    arith = REPO / "tasks"
    jobs = {
        "likelihood": _cmd("pretrained=tiny-llada,mc_num=8", root / "likelihood",
                           "arith_choice,arith_greedy", TASKS),
        "llada": _cmd("pretrained=tiny-llada,mc_num=8,cfg_scale=0.5,mc_stratum=4,"
                      "mask_logit=kept", root / "llada", "arith_choice", TASKS),
        # a canvas of 32 tokens, answers capped at 5 (arith's answers run to about 60)
        "max_gen_toks": _cmd("pretrained=tiny-llada,gen_length=32,block_length=32",
                             root / "max_gen_toks", "arith", arith,
                             "--gen_kwargs", "max_gen_toks=5"),
        # arith's generation_kwargs say temperature 0.0
        "do_sample": _cmd("pretrained=tiny-llada,gen_length=32", root / "do_sample", "arith",
                          arith, "--gen_kwargs", "do_sample=true"),
        "batch_size": _cmd("pretrained=tiny-llada,batch_size=4", root / "batch_size", "arith",
                           arith, "--batch_size", "8"),
    }

    def run(item):
        name, cmd = item
        proc = subprocess.run(cmd, cwd=root, env=_env(), capture_output=True, text=True,
                              timeout=600)
        return name, Run(proc, root / name)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, jobs.items()))


def test_multiple_choice_runs_no_greedy_check_and_reports_its_costs(runs):
    """lm-eval's multiple_choice accuracy reads the log-likelihoods only: is_greedy is False
    for every choice and costs nothing; each continuation's 8 draws go into one model call
    (batch_size 1, mc_batch 32), so the task's calls are its continuations."""
    run = runs["likelihood"].ok()
    samples = run.samples("arith_choice")
    assert len(samples) == LIMIT
    assert [[g for (_, g), in s["resps"]] for s in samples] == [["False"] * 4] * LIMIT
    totals = run.results["config"]["pvf"]["totals"]["arith_choice"]
    assert (totals["requests"], totals["nfe_total"], totals["mc_num"], totals["greedy_checks"]) \
        == (4 * LIMIT, 4 * LIMIT, 8.0, 0)
    # the samples carry the same costs: per document, summed over its four choices
    assert [s["nfe"] for s in samples] == [4.0] * LIMIT
    assert [s["mc_num"] for s in samples] == [8.0] * LIMIT
    assert sum(s["canvases"] for s in samples) == totals["canvases_total"]
    assert totals["branch_rows"] == totals["canvases"]          # one row per canvas
    # a one-token continuation's draws are one canvas, so a document costs 4 to 4 * 8
    assert all(4 <= s["canvases"] <= 32 for s in samples)


def test_a_loglikelihood_tasks_acc_is_llada_suffix_greedy(runs):
    """``output_type: loglikelihood``: lm-eval's acc is is_greedy, here LLaDA's
    suffix_greedy_prediction, checked against that reference on the same model; its calls
    (one per step after the first, which a draw holds) join the task's totals."""
    from test_likelihood import _llada_suffix_greedy

    from helpers.prerequisites import require_bundled_weights
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    run = runs["likelihood"].ok()
    samples = run.samples("arith_greedy")
    require_bundled_weights("tiny-llada")
    lm = PVFDiffusionLM(pretrained="tiny-llada", device="cpu")
    want = [_llada_suffix_greedy(lm.model, *lm.prompts.pair(*s["arguments"]["gen_args_0"]
                                                            .values()))
            for s in samples]
    assert [s["acc"] for s in samples] == [int(ok) for ok, _ in want]
    assert 0 < sum(ok for ok, _ in want) < LIMIT
    totals = run.results["config"]["pvf"]["totals"]["arith_greedy"]
    assert totals["nfe_total"] == LIMIT + sum(n - 1 for _, n in want)
    assert totals["greedy_checks"] == sum(n > 1 for _, n in want)


def test_llada_likelihood_settings_are_recorded_and_guidance_doubles_the_rows(runs):
    run = runs["llada"].ok()
    pvf = run.results["config"]["pvf"]
    assert pvf["likelihood"] == {"mc_num": 8, "mc_stratum": 4, "cfg_scale": 0.5,
                                 "mask_logit": "kept", "mc_batch": 32}
    totals = pvf["totals"]["arith_choice"]
    assert totals["branch_rows"] == 2 * totals["canvases"]
    plain = runs["likelihood"].ok().samples("arith_choice")
    guided = run.samples("arith_choice")
    assert [s["resps"] for s in guided] != [s["resps"] for s in plain]


def test_max_gen_toks_caps_the_answer_on_a_longer_canvas(runs):
    """HFLM generates at most max_gen_toks tokens; here the canvas stays gen_length (32) and
    the answer keeps its first 5 tokens."""
    run = runs["max_gen_toks"].ok()
    samples = run.samples("arith")
    assert [(s["gen_tokens"], s["gen_length"]) for s in samples] == [(5.0, 32.0)] * LIMIT
    # 5 tokens of "Step 1: ..." hold no "####": no answer extracted
    assert [s["exact_match"] for s in samples] == [0.0] * LIMIT


def test_do_sample_without_a_temperature_is_one_line(runs):
    proc = runs["do_sample"].proc
    assert proc.returncode == 1
    assert runs["do_sample"].last_line == (
        "pvf-dlm: do_sample=True with temperature=0.0 (task generation_kwargs, --gen_kwargs or "
        "the temperature model arg): sampling needs a temperature > 0 (HFLM refuses it too); "
        "give one, e.g. --gen_kwargs do_sample=true,temperature=0.7, or do_sample=false for "
        "greedy decoding")
    assert "Traceback" not in proc.stderr


def test_batch_size_given_twice_is_one_line(runs):
    proc = runs["batch_size"].proc
    assert proc.returncode == 1
    assert runs["batch_size"].last_line == (
        "pvf-dlm: batch_size=4 in --model_args and --batch_size 8 disagree; give one of them")
    assert "Traceback" not in proc.stderr
