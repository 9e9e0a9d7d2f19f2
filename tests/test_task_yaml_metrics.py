"""Every bundled task's ``metric_list``, as lm-eval 0.4.13 loads its YAML (``include:`` and
``!function`` resolved): the task's accuracy rows, then the decoding costs, written once in
``lmeval/task_metrics.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402

TASKS = Path(__file__).resolve().parents[1] / "tasks"
#: the cost rows of the results table, in order: (metric, aggregation, higher is better)
COSTS = [("nfe", "mean", False), ("tpf", "ratio_of_sums", True),
         ("branch_rows", "mean", False), ("gen_tokens", "mean", True),
         ("committed", "mean", True), ("gen_length", "mean", True), ("wall_s", "mean", False),
         ("tps", "ratio_of_sums", True), ("tokens_base", "mean", True),
         ("tokens_plan", "mean", True), ("tokens_ar", "mean", True),
         ("tokens_forced", "mean", True), ("tokens_explore", "mean", True),
         ("tokens_edit", "mean", True), ("edits", "mean", False), ("remasks", "mean", False)]
MEAN = "mean"
ACCURACY = {
    "arith/arith.yaml": ["exact_match"],
    "arith_var/arith_var.yaml": ["exact_match"],
    "gsm8k_pvf/gsm8k_pvf.yaml": ["exact_match", "exact_match_flexible"],
    "gsm8k_pvf/gsm8k_cot_pvf_chat.yaml": ["exact_match", "exact_match_flexible"],
    "math500_pvf/math500_pvf.yaml": ["exact_match", "math_verify"],
    "mmlu_pro_pvf/mmlu_pro_pvf_chat.yaml": ["exact_match"],
    "hellaswag_llada/hellaswag_llada_oc.yaml": ["exact_match"],
    "humaneval_pvf/humaneval_pvf.yaml": ["pass@1", "verdict"],
    "humaneval_pvf/humaneval_instruct_pvf.yaml": ["pass@1", "verdict"],
    "humaneval_pvf/humaneval_pvf_sampled.yaml": ["pass@1", "pass@5", "pass@10", "verdict"],
    "mbpp_llada/mbpp_llada_oc.yaml": ["pass@1", "verdict"],
    "mbpp_llada/mbpp_llada_oc_base.yaml": ["pass@1", "verdict"],
    "mbpp_llada/mbpp_llada.yaml": ["pass@1", "verdict"],
}


def _row(row: dict) -> tuple:
    agg = row["aggregation"]
    return row["metric"], agg if isinstance(agg, str) else agg.__name__, row["higher_is_better"]


@pytest.mark.parametrize("task", list(ACCURACY))
def test_accuracy_rows_then_the_costs(task):
    rows = [_row(r) for r in load_yaml(TASKS / task)["metric_list"]]
    accuracy = [(m, "verdict_counts" if m == "verdict" else MEAN, True) for m in ACCURACY[task]]
    assert rows == accuracy + COSTS

