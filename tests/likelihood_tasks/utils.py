"""Likelihood tasks over the held-out ``arith`` items, for the CLI tests
(tests/test_lm_eval_likelihood.py).

``arith_choice``: ``multiple_choice``, the item's result and three wrong ones after the
solution's ``####`` (its ``process_results`` adds the likelihood costs to each sample);
``arith_greedy``: ``output_type: loglikelihood`` whose ``acc`` reads ``is_greedy`` (lambada's
form), the solution's last two lines after the rest.
"""

from __future__ import annotations

from pathlib import Path

from pvf_lmeval.lmeval.arith_tasks import load_splits
from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.task_metrics import LIKELIHOOD_COSTS, likelihood_costs

HERE = Path(__file__).resolve().parent
quiet_custom_dataset_notice(HERE)
DATA = HERE.parents[1] / "tasks" / "arith" / "data"


def load(**kwargs):
    return load_splits(DATA)


def head(doc) -> str:
    """The question and the solution up to its ``####``."""
    return f"Question: {doc['question']}\nAnswer: {doc['answer'].rsplit('#### ', 1)[0]}####"


def choices(doc) -> list[str]:
    n = int(doc["target"])
    return [str(n), str(n + 1), str(n + 2), str(n + 3)]


def process_results(doc, results):
    """lm-eval's multiple-choice accuracy (the first choice is the answer), then the costs of
    the document's continuations (pvf-dlm's answers carry them)."""
    lls = [float(ll) for ll, _ in results]
    return {"acc": float(max(range(len(lls)), key=lls.__getitem__) == 0),
            **likelihood_costs(results)}


#: accuracy, then the likelihood costs as per-sample means
METRICS = [{"metric": m, "aggregation": "mean", "higher_is_better": m == "acc"}
           for m in ("acc", *LIKELIHOOD_COSTS)]


def head_lines(doc) -> str:
    """The question and the solution but its last two lines."""
    return f"Question: {doc['question']}\nAnswer: {doc['answer'].rsplit(chr(10), 2)[0]}\n"


def last_lines(doc) -> str:
    """The solution's last two lines (``So ... has N ...`` and ``#### N``: 10 tokens)."""
    return "\n".join(doc["answer"].split("\n")[-2:])
