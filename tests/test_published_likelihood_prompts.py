"""LLaDA-8B-Base's likelihood rows (``pvf_lmeval/lmeval/published.py``): the requests lm-eval
0.4.13 builds for each row's command, and the token ids pvf-dlm's estimator reads for them, are
the ones LLaDA's ``eval_llada_lm_eval.sh`` produced: lm-eval 0.4.8's requests (the version it
pins) split by ``eval_llada.py``'s ``_encode_pair``.

Expected values: ``tests/data/published/likelihood.json``, written by running lm-eval 0.4.8
(with transformers 4.49.0, as the script pins) and ML-GSAI/LLaDA @ b7e6c35's
``LLaDAEvalHarness.loglikelihood`` outside the repository on hand-made documents in each
dataset's field shape (no dataset can be downloaded here), with tiny-llada's tokenizer; see
that folder's README.md. MMLU, CMMLU and C-Eval are checked on two subjects each (their other
subtasks differ only in the subject's name).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.prerequisites import family_tier
from pvf_lmeval.lmeval.published import published, published_rows

REPO = Path(__file__).resolve().parent.parent
FIXTURE = json.loads((Path(__file__).resolve().parent / "data" / "published"
                      / "likelihood.json").read_text())
#: the bundled variant that stands for a command's lm-eval task (tasks/gpqa_llada/)
VARIANT = {"gpqa_main_n_shot": "gpqa_main_n_shot_llada"}
#: lm-eval's task folders the rows' tasks live in (indexing only these keeps the test fast)
BUILTIN_DIRS = ("truthfulqa", "arc", "hellaswag", "winogrande", "piqa", "mmlu/default", "cmmlu",
                "ceval")


def test_every_likelihood_command_is_in_the_fixture():
    rows = {n: r for n, r in published_rows().items() if "mc_num" in r.decoding}
    scripts = {VARIANT.get(t, t) for t in FIXTURE["tasks"]}
    assert {r.task for r in rows.values()} == scripts
    assert FIXTURE["lm_eval"] == "0.4.8"


@pytest.fixture
def hand_made_docs(monkeypatch):
    """``datasets.load_dataset`` returns the fixture's documents for the paths lm-eval 0.4.13
    (and the GPQA variant) ask for; anything else is an error."""
    import datasets

    def load_dataset(path=None, name=None, split=None, **_):
        key = f"{path}:{name or ''}"
        assert key in FIXTURE["documents"], key
        dd = datasets.DatasetDict({s: datasets.Dataset.from_list(docs)
                                   for s, docs in FIXTURE["documents"][key].items()})
        return dd[split] if split is not None else dd

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


@pytest.fixture(scope="module")
def plugin():
    """pvf-dlm on tiny-llada with a likelihood row's model args (the estimator's settings do not
    change the requests or their ids), and a task manager that indexes only the tasks' folders."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from helpers.prerequisites import require_bundled_weights
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    args = dict(kv.split("=", 1) for kv in published("llada-base-piqa-cfg").model_args().split(","))
    args["pretrained"] = "tiny-llada"
    lm = PVFDiffusionLM.create_from_arg_string(",".join(f"{k}={v}" for k, v in args.items()),
                                               {"device": "cpu"})
    builtin = Path(lm_eval.__file__).parent / "tasks"
    tm = TaskManager(include_path=[str(builtin / d) for d in BUILTIN_DIRS] + [str(REPO / "tasks")],
                     include_defaults=False)
    return lm, tm


def _ours(task: str, plugin, monkeypatch) -> tuple[list, set]:
    """The requests of the row's command (its task, few-shot count) on the fixture's leaf
    tasks through pvf-dlm: each request with the (context, continuation) ids ``prompts.pair``
    gives, and the (prefix, target) ids the estimator was handed (stubbed: nothing is scored)."""
    import lm_eval
    import lm_eval.evaluator
    import torch

    import pvf_lmeval.decoding.likelihood as likelihood

    lm, tm = plugin
    scored, seen = set(), []

    def record(model, items, **kwargs):
        scored.update((tuple(c.prefix), tuple(c.target)) for c in items)
        return [likelihood.Likelihood(-1.0, None, torch.zeros(1), 0) for _ in items]

    monkeypatch.setattr(likelihood, "loglikelihoods", record)
    # the results' environment report runs torch's collect_env (seconds of subprocesses)
    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)
    score = type(lm).loglikelihood
    monkeypatch.setattr(lm, "loglikelihood", lambda requests, disable_tqdm=False: (
        seen.extend(requests), score(lm, requests, disable_tqdm=True))[1])
    row = published(f"llada-base-{task}")
    leaves = [VARIANT.get(t, t) for t in FIXTURE["tasks"][task]["leaf_tasks"]]
    assert row.task == VARIANT.get(task, task)
    lm_eval.simple_evaluate(model=lm, tasks=leaves, num_fewshot=row.num_fewshot, task_manager=tm,
                            random_seed=0, numpy_random_seed=1234, torch_random_seed=1234,
                            fewshot_random_seed=1234)
    return [(r, lm.prompts.pair(*r.args[:2])) for r in seen], scored


#: truthfulqa_mc2 imports its generation task's scorers (about 3 s): in the family tier
TASKS = [pytest.param(t, marks=family_tier) if t == "truthfulqa_mc2" else t
         for t in FIXTURE["tasks"]]


@pytest.mark.parametrize("task", TASKS)
def test_requests_and_ids_are_eval_lladas(task, plugin, hand_made_docs, monkeypatch):
    """Per request (task, document, choice): the context and continuation strings lm-eval
    0.4.8 built, and the ids ``eval_llada.py`` split them into, equal ours; every pair of ids
    reached the estimator."""
    want = FIXTURE["tasks"][task]["requests"]
    ours, scored = _ours(task, plugin, monkeypatch)
    by_key = {(r.task_name, r.doc_id, r.idx): (r.args[:2], ids) for r, ids in ours}
    assert len(by_key) == len(ours) == len(want)
    for w in want:
        leaf = VARIANT.get(w["task"], w["task"])
        strings, (prefix, target) = by_key[(leaf, w["doc_id"], w["idx"])]
        where = (task, w["doc_id"], w["idx"])
        assert strings == (w["context"], w["continuation"]), where
        assert (prefix, target) == ([int(i) for i in w["prefix_ids"].split()],
                                    [int(i) for i in w["target_ids"].split()]), where
    assert scored == {(tuple(p), tuple(t)) for _, (p, t) in ours}


def test_lmeval_0413s_own_gpqa_differs(hand_made_docs, monkeypatch):
    """Why GPQA's rows run the variant: lm-eval 0.4.13's gpqa_main_n_shot keeps bracketed
    answer text and orders each question's answers otherwise."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(Path(lm_eval.__file__).parent / "tasks" / "gpqa"),
                     include_defaults=False)
    task = tm.load(["gpqa_main_n_shot"])["tasks"]
    task = next(iter(task.values())) if isinstance(task, dict) else task[0]
    want = {w["doc_id"]: w["context"] for w in FIXTURE["tasks"]["gpqa_main_n_shot"]["requests"]}
    task.set_fewshot_seed(1234)
    task.build_all_requests(limit=None, rank=0, world_size=1)
    got = {i.doc_id: i.args[0] for i in task.instances}
    assert set(got) == set(want) and all(got[d] != want[d] for d in want)
    assert "[NeV] 3426" in got[2] and "[NeV]" not in want[2]
