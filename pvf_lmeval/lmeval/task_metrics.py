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


def ratio_of_sums(items) -> float:
    """Aggregate :class:`SummedRate` items as sum(numerators) / sum(denominators); NaN when
    undefined."""
    parts = [item.for_aggregation for item in items]
    num = sum(n for n, _ in parts)
    den = sum(d for _, d in parts)
    if not parts or math.isnan(num) or math.isnan(den) or den == 0:
        return NAN
    return num / den


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
