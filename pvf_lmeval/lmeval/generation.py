"""Answers that carry their statistics (a generated string, a log-likelihood) and the text-side
helpers of generation (stop strings)."""

from __future__ import annotations


class GenerationText(str):
    """A generated string with its decoding statistics in ``.meta`` (SPEC "Statistics") and the
    name of its ``task``.

    lm-eval passes it unchanged through the default ``take_first`` filter into a task's
    ``process_results``; it pickles with its ``meta`` and ``task`` (so an answer read back from
    ``--use_cache`` still carries its statistics, and the run's totals count them).
    """

    def __new__(cls, text: str, meta: dict | None = None, task: str | None = None):
        obj = super().__new__(cls, text)
        obj.meta = dict(meta or {})
        obj.task = task
        return obj

    def __reduce__(self):
        return (GenerationText, (str(self), self.meta, self.task))


class LikelihoodScore(float):
    """A log-likelihood with its costs in ``.meta`` (``decoding.likelihood.Likelihood.stats``:
    ``nfe``, ``branch_rows``, ``canvases``, ``mc_num``), which a task's ``process_results`` reads
    (``task_metrics.likelihood_costs``). It pickles as a plain float: lm-eval's ``--use_cache``
    stores the number only."""

    def __new__(cls, value: float, meta: dict | None = None):
        obj = super().__new__(cls, value)
        obj.meta = dict(meta or {})
        return obj

    def __reduce__(self):
        return (float, (float(self),))


def cut_at_stop(text: str, until: list[str]) -> int:
    """Index of the earliest occurrence of any non-empty ``until`` string, or ``len(text)``."""
    hits = [text.find(s) for s in until if s]
    hits = [h for h in hits if h >= 0]
    return min(hits) if hits else len(text)


def tokens_before(ids: list[int], cut: int, tokenizer) -> int:
    """How many leading tokens of ``ids`` decode to text that ends at or before character ``cut``.

    Binary search over prefixes (decoded length grows with the prefix), so a 512-token answer
    costs about ten decodes.
    """
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) <= cut:
            lo = mid
        else:
            hi = mid - 1
    return lo
