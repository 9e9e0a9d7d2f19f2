"""Decoding-cost metrics for task YAMLs (SPEC "Statistics"), usable with any lm-eval model.

``process_results`` functions call :func:`cost_metrics` on the raw generation *before* any regex
filter turns it into a plain ``str``. A generation without statistics (another model type, e.g.
``--model hf``) yields NaN costs rather than an error; accuracy is scored the same way.
Rates (``tpf``, ``tps``) are ratios of sums over a task: per sample they are the request's own
rate (what the samples log shows), a :class:`SummedRate` that also carries the numerator and
denominator :func:`ratio_of_sums` aggregates.
"""

from __future__ import annotations

import math

from .stats import MEAN_KEYS

NAN = float("nan")
RATES = {"tpf": ("gen_tokens", "nfe"), "tps": ("gen_tokens", "wall_s")}


class SummedRate(float):
    """A per-request rate (``numerator / denominator``; 0 when the denominator is 0, NaN when
    unknown) with the two sums it is aggregated from in ``for_aggregation``.

    It is a float, so the samples JSONL records the rate itself; it pickles with its parts, so
    data-parallel gathering keeps them."""

    def __new__(cls, numerator: float, denominator: float):
        if math.isnan(numerator) or math.isnan(denominator):
            value = NAN
        else:
            value = numerator / denominator if denominator else 0.0
        obj = super().__new__(cls, value)
        obj.for_aggregation = (float(numerator), float(denominator))
        return obj

    def __reduce__(self):
        return (SummedRate, self.for_aggregation)


def cost_metrics(generation) -> dict:
    """Per-sample cost metrics of one generation: means as floats, rates as :class:`SummedRate`."""
    meta = getattr(generation, "meta", None) or {}
    out = {k: float(meta[k]) if k in meta else NAN for k in MEAN_KEYS}
    for rate, (num, den) in RATES.items():
        out[rate] = SummedRate(out[num], out[den])
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
