"""Decoding-cost metrics for task YAMLs (SPEC "Statistics"), usable with any lm-eval model.

A bundled task's ``metric_list`` is :func:`metric_list` of its accuracy rows: its YAML says
``metric_list: !function utils.METRICS`` (lm-eval's ``!function`` tag reads any attribute of the
task's ``utils.py``; its ``include:`` merges top-level keys only, so a task's own accuracy rows
would replace an included list whole), and the cost rows are written here once.

``process_results`` functions call :func:`cost_metrics` on the raw generation *before* any regex
filter turns it into a plain ``str``. A generation without statistics (another model type, e.g.
``--model hf``) yields NaN costs rather than an error; accuracy is scored the same way.
Rates (``tpf``, ``tps``) are ratios of sums over a task: per sample they are the request's own
rate (what the samples log shows), a :class:`SummedRate` that also carries the numerator and
denominator :func:`ratio_of_sums` aggregates.
"""

from __future__ import annotations

import math

from ..decoding.loop import RATES, rate
from .stats import MEAN_KEYS

NAN = float("nan")


class SummedRate(float):
    """A per-request rate (``numerator / denominator``; 0 when the denominator is 0, NaN when
    unknown) with the two sums it is aggregated from in ``for_aggregation``.

    It is a float, so the samples JSONL records the rate itself; it pickles with its parts, so
    data-parallel gathering keeps them."""

    def __new__(cls, numerator: float, denominator: float):
        if math.isnan(numerator) or math.isnan(denominator):
            value = NAN
        else:
            value = rate(numerator, denominator)
        obj = super().__new__(cls, value)
        obj.for_aggregation = (float(numerator), float(denominator))
        return obj

    def __reduce__(self):
        return (SummedRate, self.for_aggregation)


def cost_metrics(generation) -> dict:
    """Per-sample cost metrics of one generation: means as floats, rates as :class:`SummedRate`."""
    meta = getattr(generation, "meta", None) or {}
    out = {k: float(meta[k]) if k in meta else NAN for k in MEAN_KEYS}
    for name, (num, den) in RATES.items():
        out[name] = SummedRate(out[num], out[den])
    return out



def oc_letter_results(generation, label: str, letters: str = "ABCD") -> dict:
    """Per-sample results of an OpenCompass multiple-choice generation task: ``exact_match`` when
    the first option ``first_option_postprocess`` finds (options ``letters``) is ``label``
    (``AccEvaluator``), then the generation's cost metrics."""
    from . import published_answers as pa

    right = pa.oc_choice_correct(pa.oc_first_option(str(generation), letters), label)
    return {"exact_match": float(right), **cost_metrics(generation)}

#: the per-sample costs of a likelihood task (:func:`likelihood_costs`)
LIKELIHOOD_COSTS = ("nfe", "branch_rows", "canvases", "mc_num")


def likelihood_costs(results) -> dict:
    """Per-sample costs of one document's likelihood answers (lm-eval's ``results``: one
    ``(logprob, is_greedy)`` per continuation): model calls, rows and canvases summed over its
    continuations, ``mc_num`` the draws per continuation. Answers without statistics (another
    model type, or read from ``--use_cache``) yield NaN."""
    metas = [getattr(r[0], "meta", None) for r in results]
    if not metas or any(not m for m in metas):
        return dict.fromkeys(LIKELIHOOD_COSTS, NAN)
    out = {k: float(sum(m[k] for m in metas)) for k in ("nfe", "branch_rows", "canvases")}
    out["mc_num"] = float(metas[0]["mc_num"])
    return out


def ratio_of_sums(items) -> float:
    """Aggregate :class:`SummedRate` items as sum(numerators) / sum(denominators); NaN when
    undefined."""
    parts = [item.for_aggregation for item in items]
    num = sum(n for n, _ in parts)
    den = sum(d for _, d in parts)
    if not parts or math.isnan(num) or math.isnan(den) or den == 0:
        return NAN
    return num / den


def mean_of_group_means(items) -> float:
    """Aggregate (group, value) items as the plain mean of the per-group means: a summary that
    weighs every group alike whatever its size (OpenCompass's ``naive_average`` over the
    per-subject datasets of MMLU and MMLU-Pro)."""
    groups: dict = {}
    for group, value in items:
        groups.setdefault(group, []).append(value)
    return math.fsum(math.fsum(v) / len(v) for v in groups.values()) / len(groups)


def mean_of_concatenated(items) -> float:
    """Aggregate lists of verdicts as the mean over all their elements together: a score per
    instruction rather than per prompt (IFEval's instruction-level accuracy)."""
    flat = [v for item in items for v in item]
    return math.fsum(flat) / len(flat)


#: the cost rows of a task's results table, in its order: (metric, higher is better); the
#: rates aggregate as ratios of sums, the rest as means
COSTS = (("nfe", False), ("tpf", True), ("branch_rows", False), ("gen_tokens", True),
         ("committed", True), ("gen_length", True), ("wall_s", False), ("tps", True),
         ("tokens_base", True), ("tokens_plan", True), ("tokens_ar", True),
         ("tokens_forced", True), ("tokens_explore", True), ("tokens_edit", True),
         ("edits", False), ("remasks", False))


def metric_list(*accuracy) -> list[dict]:
    """A task's ``metric_list``: its ``accuracy`` rows (a metric's name: its mean, higher is
    better; or a row as lm-eval reads it), then the decoding costs (:data:`COSTS`)."""
    rows = [a if isinstance(a, dict) else {"metric": a, "aggregation": "mean",
                                           "higher_is_better": True} for a in accuracy]
    return rows + [{"metric": m, "aggregation": ratio_of_sums if m in RATES else "mean",
                    "higher_is_better": up} for m, up in COSTS]
