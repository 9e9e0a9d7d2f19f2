"""Scoring of the code tasks (HumanEval, MBPP): each sample's program checked in
:mod:`pvf_lmeval.sandbox`, pass@k over a problem's samples, the sandbox's verdicts counted, and
the decoding costs of the raw generations (``process_results`` bodies of ``tasks/*/utils.py``)."""

from __future__ import annotations

import logging
import math

from pvf_lmeval.lmeval.task_metrics import RATES, SummedRate, cost_metrics

from .pass_at_k import pass_at_k

log = logging.getLogger("pvf_lmeval")
NAN = float("nan")
_warned: set[int] = set()


def k_list(value) -> list[int]:
    """The ``pass_at_k`` metadata as a list of k >= 1 (default ``[1]``)."""
    if value is None:
        return [1]
    if isinstance(value, (int, str)):
        value = [value]
    ks = [int(k) for k in value]
    if not ks or min(ks) < 1:
        raise ValueError(f"humaneval: pass_at_k must be a list of k >= 1, got {value!r}")
    return ks


def pass_at_k_values(n: int, c: int, ks) -> dict:
    """``{"pass@k": unbiased estimate}`` for each k; NaN (and a warning once) when k > n."""
    out = {}
    for k in k_list(ks):
        if k > n:
            if k not in _warned:
                _warned.add(k)
                log.warning("humaneval: pass@%d needs at least %d samples per problem, got %d: "
                            "reporting NaN", k, k, n)
            out[f"pass@{k}"] = NAN
        else:
            out[f"pass@{k}"] = pass_at_k(n, c, k)
    return out


def generation_costs(generations: list) -> dict:
    """SPEC cost metrics of a problem's samples: means of the means, rates over the summed parts."""
    per = [cost_metrics(g) for g in generations]
    out = {}
    for key in per[0]:
        if key in RATES:
            out[key] = SummedRate(math.fsum(p[key].for_aggregation[0] for p in per),
                                  math.fsum(p[key].for_aggregation[1] for p in per))
        else:
            out[key] = math.fsum(p[key] for p in per) / len(per)
    return out


def generations(results: list) -> list:
    """A problem's samples from ``process_results``' ``results``: one generation, or the list a
    keep-all filter passes."""
    gens = results[0]
    return [gens] if isinstance(gens, str) else list(gens)


def score_jobs(gens: list, jobs: list[dict], ks, *, timeout: float,
               workers: int | None = None) -> dict:
    """Costs from the raw generations' ``.meta`` (read first, from the objects the model
    returned), then each job (:func:`pvf_lmeval.sandbox.check_candidates`; one per generation)
    checked: pass@k for each k of ``ks`` and ``verdict``, the samples' verdicts in order."""
    from pvf_lmeval.sandbox import check_candidates

    out = generation_costs(gens)
    runs = check_candidates(jobs, workers=workers, timeout=timeout)
    out.update(pass_at_k_values(len(runs), sum(r.passed for r in runs), ks))
    out["verdict"] = [r.reason for r in runs]
    return out


def verdict_counts(items) -> str:
    """Aggregation of ``verdict``: how many samples got each verdict, in
    ``pvf_lmeval.sandbox.REASONS`` order, e.g. ``"passed 3, failed 1, syntax 1"``."""
    from pvf_lmeval.sandbox import REASONS

    verdicts = [v for item in items for v in ([item] if isinstance(item, str) else item)]
    return ", ".join(f"{r} {verdicts.count(r)}" for r in REASONS if r in verdicts)


#: the sandbox's verdict of each sample (``pvf_lmeval.sandbox.REASONS``): the results table shows
#: how many samples got each
VERDICT = {"metric": "verdict", "aggregation": verdict_counts, "higher_is_better": True}
