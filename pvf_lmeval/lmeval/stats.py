"""Per-task totals of decoding and likelihood statistics, mergeable across data-parallel ranks.

A generation answer has SPEC "Statistics"; a likelihood answer (a scored continuation, a
rolling text) has :data:`LIKELIHOOD_KEYS`: the model calls that computed its canvases (``nfe``),
their model rows (``branch_rows``: twice the canvases under classifier-free guidance), the
distinct canvases (``canvases``) and the Monte Carlo draws (``mc_num``); a greedy check run
when lm-eval reads ``is_greedy`` adds its calls and canvases to its continuation's
(``greedy_checks`` counts the answers that ran one). A task's row holds its generation
answers; a task of likelihood answers only has their statistics in its row, and a task with
both kinds has them under ``likelihood`` in its row.
"""

from __future__ import annotations

from collections import defaultdict

from ..decoding.loop import RATES, rate

#: statistics that are summed and reported as a mean per request
MEAN_KEYS = ("nfe", "branch_rows", "gen_length", "gen_tokens", "committed", "wall_s",
             "tokens_base", "tokens_plan", "tokens_ar", "tokens_forced", "tokens_explore",
             "tokens_edit", "edits", "remasks")

#: per-task counters reported as totals, not means: prompts cut to fit the context, and requests
#: answered from lm-eval's ``--use_cache`` (their statistics are those of the run that made them)
COUNT_KEYS = ("truncated_prompts", "from_cache")

#: statistics of a likelihood answer, summed and reported as a mean per answer
LIKELIHOOD_KEYS = ("nfe", "branch_rows", "canvases", "mc_num")
#: per-task counter of likelihood answers: greedy checks that ran model calls of their own
#: (lm-eval read ``is_greedy`` and the draws had not decided it)
LIKELIHOOD_COUNTS = ("greedy_checks",)
#: the prefix of the likelihood sums in a task's row (its generation sums have none)
L = "likelihood."


class StatTotals:
    """Sums of SPEC "Statistics" per task; ``summary()`` gives means and ratio-of-sums rates."""

    def __init__(self):
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def add(self, task: str, stats: dict, *, from_cache: bool = False) -> None:
        row = self.sums[task]
        row["requests"] += 1
        for k in MEAN_KEYS:
            row[k] += stats[k]
        if from_cache:
            row["from_cache"] += 1

    def add_likelihood(self, task: str, stats: dict, *, greedy_check: bool = False) -> None:
        """A likelihood answer of ``task`` with its statistics (:data:`LIKELIHOOD_KEYS`, a greedy
        check's calls included); ``greedy_check``: one ran calls of its own for it."""
        row = self.sums[task]
        row[L + "requests"] += 1
        for k in LIKELIHOOD_KEYS:
            row[L + k] += stats[k]
        row[L + "greedy_checks"] += bool(greedy_check)

    def count(self, task: str, key: str, n: int = 1) -> None:
        """Add ``n`` to a per-task counter that is reported as a total (``truncated_prompts``)."""
        self.sums[task][key] += n

    def state(self) -> dict:
        return {t: dict(r) for t, r in self.sums.items()}

    def absorb(self, state: dict) -> None:
        """Add another ``state()`` (a rank's) to these totals, key by key."""
        for task, row in state.items():
            for k, v in row.items():
                self.sums[task][k] += v

    @classmethod
    def merged(cls, states: list[dict]) -> "StatTotals":
        """The totals of several ``state()`` dicts (one per rank), summed key by key."""
        out = cls()
        for st in states:
            out.absorb(st)
        return out

    def summary(self) -> dict:
        out = {}
        for task, row in sorted(self.sums.items()):
            n, lik = row.get("requests", 0), _likelihood_summary(row)
            if not n:
                if lik:
                    out[task] = lik
                continue
            s = {"requests": int(n)}
            s.update({k: row[k] / n for k in MEAN_KEYS})
            s.update({k: rate(row[num], row[den]) for k, (num, den) in RATES.items()})
            s["nfe_total"] = int(row["nfe"])
            s.update({k: int(row.get(k, 0)) for k in COUNT_KEYS})
            if lik:
                s["likelihood"] = lik
            out[task] = s
        return out


def _likelihood_summary(row: dict) -> dict | None:
    """The likelihood answers' part of a task's row: means per answer, totals of calls and
    canvases, the counters; None without likelihood answers."""
    n = row.get(L + "requests", 0)
    if not n:
        return None
    s = {"requests": int(n)}
    s.update({k: row[L + k] / n for k in LIKELIHOOD_KEYS})
    s["nfe_total"] = int(row[L + "nfe"])
    s["canvases_total"] = int(row[L + "canvases"])
    s.update({k: int(row.get(L + k, 0)) for k in LIKELIHOOD_COUNTS})
    return s
