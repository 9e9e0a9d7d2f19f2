"""Decoding-cost metrics for task YAMLs (SPEC "Statistics"), usable with any lm-eval model.

``process_results`` functions call :func:`cost_metrics` on the raw generation *before* any regex
filter turns it into a plain ``str``. A generation without statistics (another model type, e.g.
``--model hf``) yields NaN costs rather than an error; accuracy is scored the same way.
Rates (``tpf``, ``tps``) are ratios of sums: per sample they carry a (numerator, denominator)
pair that :func:`ratio_of_sums` aggregates.
"""

from __future__ import annotations

import math

from .stats import MEAN_KEYS

NAN = float("nan")
RATES = {"tpf": ("gen_tokens", "nfe"), "tps": ("gen_tokens", "wall_s")}


def cost_metrics(generation) -> dict:
    """Per-sample cost metrics of one generation: means as floats, rates as pairs."""
    meta = getattr(generation, "meta", None) or {}
    out = {k: float(meta[k]) if k in meta else NAN for k in MEAN_KEYS}
    for rate, (num, den) in RATES.items():
        out[rate] = (out[num], out[den])
    return out


def ratio_of_sums(items) -> float:
    """Aggregate (numerator, denominator) pairs as sum(num) / sum(den); NaN when undefined."""
    items = list(items)
    num = sum(float(n) for n, _ in items)
    den = sum(float(d) for _, d in items)
    if not items or math.isnan(num) or math.isnan(den) or den == 0:
        return NAN
    return num / den
