"""Per-task totals of decoding statistics, mergeable across data-parallel ranks."""

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
            n = row["requests"]
            if not n:
                continue
            s = {"requests": int(n)}
            s.update({k: row[k] / n for k in MEAN_KEYS})
            s.update({k: rate(row[num], row[den]) for k, (num, den) in RATES.items()})
            s["nfe_total"] = int(row["nfe"])
            s.update({k: int(row.get(k, 0)) for k in COUNT_KEYS})
            out[task] = s
        return out
