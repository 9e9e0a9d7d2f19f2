"""Reading lm-eval output folders: one :class:`Entry` per (results file, task).

Accuracy is the task's accuracy metric (``exact_match``, the built-ins' ``strict-match`` row
first; ``--metric`` picks another) with lm-eval's standard error. Costs come from the task's own
metrics (the pvf task YAMLs), else from ``config.pvf.totals`` (``--model pvf-dlm`` on built-in
tasks), else from the per-sample metric fields of ``samples_<task>_<stamp>.jsonl``; runs of other
models (``--model hf``) leave them empty.

A value the report reads is what the run wrote, or the file is invalid input: an accuracy, or a
cost of a pvf-dlm run (``config.pvf``: every request has statistics), or a row of its
``config.pvf.totals``, that holds no finite number (NaN, an infinity, null, a string) is a
one-line :class:`ReportError`, never replaced by the next filter or source. The pvf task YAMLs
give NaN costs to a model without statistics (``--model hf``): its costs are empty. A standard
error that is no finite number is read as none (the gate never uses the checked file's own).
"""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...files.reads import UnreadableFile, read_bytes, read_json
from ...decoding.loop import RATES, rate
from ...lmeval import identity as ident

#: the largest results file and samples log read (lm-eval's are KiB and tens of MiB)
MAX_RESULTS_BYTES = 64 << 20
MAX_SAMPLES_BYTES = 1 << 30

#: accuracy metrics by preference, then filters by preference
ACC_METRICS = ["exact_match", "pass@1", "pass_at_1", "acc", "acc_norm", "math_verify", "f1"]
FILTER_ORDER = ["none", "strict-match", "custom-extract", "create_test", "flexible-extract"]
#: accuracy metrics scored 0 or 1 per item: their standard error follows from the mean and n
BINARY_METRICS = {"exact_match", "pass@1", "pass_at_1", "acc", "acc_norm", "math_verify"}
#: per-request statistics summed over requests (means are sums / requests, rates ratios of sums)
SUMMED = ("nfe", "branch_rows", "gen_tokens", "wall_s", "gen_length", "edits", "remasks")
#: decoding statistics the pvf task YAMLs report as metrics (besides ``tokens_<route>``): costs,
#: never an accuracy
STAT_METRICS = frozenset(SUMMED + ("tpf", "tps", "committed"))


class ReportError(Exception):
    """A file holds what it must not (invalid input): printed as one line without a traceback,
    exit status :attr:`exit_code`."""

    exit_code = 3


class UsageError(ReportError):
    """The command line asks for something that cannot be done as asked (an option out of
    range, a path that is not there, several runs where the gate takes one)."""

    exit_code = 2


@dataclass
class Entry:
    """One task of one run: what was run (``identity``) and what it measured.

    ``acc`` and ``acc_se`` are in percent; ``nfe``, ``branch_rows``, ``edits``, ``remasks``
    means per request (the last two: None for runs that predate them); ``tpf``, ``tps`` ratios
    of sums (tokens per forward / per second)."""

    path: Path
    date: float
    identity: dict
    acc: float | None = None
    acc_se: float | None = None
    acc_metric: str | None = None
    n: int | None = None
    nfe: float | None = None
    branch_rows: float | None = None
    tpf: float | None = None
    tps: float | None = None
    edits: float | None = None
    remasks: float | None = None
    cost_source: str | None = None     # metrics | totals | samples
    #: the run's batch size (lm-eval's --batch_size), identity or not: a speed ratio between
    #: runs of different batch sizes says so
    batch_size: int | None = None
    #: every accuracy-like metric the task reported (``"metric,filter"`` with a number; costs
    #: and standard errors left out): what ``--metric`` may name
    metrics: tuple = ()
    #: the results file was named on the command line (not found in a folder): the gate takes
    #: it as chosen, checked or not
    named: bool = False

    @property
    def task(self) -> str:
        return self.identity["task"]


def num(v) -> float | None:
    """A finite float, or None (missing, NaN, "N/A")."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class _NotFinite(Exception):
    """A value the report reads holds no finite number: ``args`` = (where, the value)."""


@contextmanager
def _finite(path, task: str):
    """:class:`_NotFinite` inside as a one-line :class:`ReportError` naming the file and task."""
    try:
        yield
    except _NotFinite as exc:
        where, value = exc.args
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ReportError(f"{path}: {task}: {where} = {shown} is not a finite number (no other "
                          f"field stands in for it)") from None


def find_result_files(paths) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found = sorted(p.rglob("results_*.json"))
            if not found:
                raise UsageError(f"{p}: no results_*.json below this folder (an lm_eval --output_path?)")
            files.extend(found)
        else:
            raise UsageError(f"{p}: no such file or folder")
    return files


def _metric_entries(res: dict) -> dict:
    """``{"exact_match": {"strict-match": 0.5, ...}, ...}`` (stderr rows under ``metric_stderr``)."""
    out: dict = {}
    for key, value in res.items():
        if "," not in key:
            continue
        metric, filt = key.split(",", 1)
        out.setdefault(metric, {})[filt] = value
    return out


def _pick(entries: dict, metric: str, strict: bool = True):
    """(value, filter) of ``metric`` in the first filter, by preference, the task reported it
    in, or (None, None). A value there that is no finite number raises :class:`_NotFinite`
    (``strict``) or is None: never the next filter's."""
    by_filter = entries.get(metric)
    if not by_filter:
        return None, None
    order = FILTER_ORDER + sorted(f for f in by_filter if f not in FILTER_ORDER)
    f = next(f for f in order if f in by_filter)
    value = num(by_filter[f])
    if value is None and strict:
        raise _NotFinite(f"{metric},{f}", by_filter[f])
    return value, f


def _accuracy(entries: dict, task: str, metric_choice: dict) -> tuple:
    """(value, standard error, "metric,filter") of the task's accuracy metric (fractions)."""
    wanted = metric_choice.get(task) or metric_choice.get("*")
    candidates = []
    if wanted:
        metric, _, filt = wanted.partition(",")
        candidates.append((metric, filt or None))
    if task not in metric_choice:
        candidates += [(m, None) for m in ACC_METRICS]
    for metric, filt in candidates:
        if filt is None:
            value, filt = _pick(entries, metric)
        elif filt in entries.get(metric, {}):
            value = num(entries[metric][filt])
            if value is None:
                raise _NotFinite(f"{metric},{filt}", entries[metric][filt])
        else:
            value = None
        if value is not None:
            se = num(entries.get(f"{metric}_stderr", {}).get(filt))
            return value, se, f"{metric},{filt}"
    return None, None, None


def _metric_names(entries: dict) -> tuple:
    """``"metric,filter"`` of every metric with a number, but standard errors and the decoding
    statistics (``nfe``, ``tps``, ``tokens_plan``, ...)."""
    return tuple(f"{m},{f}" for m, by_filter in entries.items()
                 if not m.endswith("_stderr") and m not in STAT_METRICS
                 and not m.startswith("tokens_")
                 for f, v in by_filter.items() if num(v) is not None)


def _impossible(path: Path, task: str, acc, acc_metric, cost: dict) -> None:
    """A one-line :class:`ReportError` for a value no run can produce: a share of items outside
    [0, 1], a mean NFE or branch-row count below 1 (every request makes at least one model call
    of at least one row), a negative rate."""
    if acc is not None and acc_metric.split(",")[0] in BINARY_METRICS and not 0.0 <= acc <= 1.0:
        raise ReportError(f"{path}: {task}: {acc_metric} = {acc!r} is not a share of items in "
                          f"[0, 1]")
    for k in ("nfe", "branch_rows"):
        if cost.get(k) is not None and cost[k] < 1.0:
            raise ReportError(f"{path}: {task}: {k} = {cost[k]!r} is below 1 (every request "
                              f"makes at least one model call of at least one row)")
    for k in ("tpf", "tps"):
        if cost.get(k) is not None and cost[k] < 0:
            raise ReportError(f"{path}: {task}: {k} = {cost[k]!r} is negative")


def _cost_from_metrics(entries: dict, strict: bool) -> dict | None:
    """Costs from the task's own metrics; None when it reports no ``nfe`` (a built-in task).
    ``strict`` (a pvf-dlm run): a cost that is no finite number raises :class:`_NotFinite`;
    otherwise it is none (the pvf task YAMLs' NaN for a model without statistics)."""
    if not entries.get("nfe"):
        return None
    return {k: _pick(entries, k, strict)[0]
            for k in ("nfe", "branch_rows", "tpf", "tps", "gen_length", "edits", "remasks")}


def _cost_from_sums(sums: dict) -> dict:
    """Means and rates from sums over requests; a statistic some request lacked (None) is
    unknown, not zero."""
    n = sums["requests"]

    def mean(k):
        return None if sums[k] is None else sums[k] / n

    rates = {k: rate(sums[num], sums[den]) if sums[num] is not None and sums[den] else None
             for k, (num, den) in RATES.items()}
    return {"nfe": mean("nfe"), "branch_rows": mean("branch_rows"), **rates,
            "gen_length": mean("gen_length"), "edits": mean("edits"), "remasks": mean("remasks")}


def _add(sums: dict, row: dict, weight: float) -> None:
    """Add ``weight`` times each statistic of ``row`` to ``sums`` (a missing one: None)."""
    sums["requests"] += weight
    for k in SUMMED:
        v = num(row.get(k))
        sums[k] = None if v is None or sums[k] is None else sums[k] + v * weight


def _cost_from_totals(totals: dict, names: list[str]) -> dict | None:
    """Costs of ``names`` from ``config.pvf.totals`` (per task: requests and means); a value
    there that is no finite number raises :class:`_NotFinite`."""
    sums = dict.fromkeys(("requests",) + SUMMED, 0.0)
    for name in names:
        row = totals.get(name)
        if not isinstance(row, dict):
            continue
        for k in ("requests",) + SUMMED:
            if k in row and num(row[k]) is None:
                raise _NotFinite(f"config.pvf.totals.{name}.{k}", row[k])
        if not num(row.get("requests")) or "nfe" not in row:
            continue
        _add(sums, row, num(row["requests"]))
    return _cost_from_sums(sums) if sums["requests"] else None


def _cost_from_samples(files: list[Path]) -> dict | None:
    """Costs from the per-sample metric fields a task's ``process_results`` wrote."""
    sums = dict.fromkeys(("requests",) + SUMMED, 0.0)
    for f in files:
        try:
            text = read_bytes(f, MAX_SAMPLES_BYTES, "samples file").decode("utf-8", "replace")
        except UnreadableFile as exc:
            raise ReportError(str(exc)) from None
        for line in text.splitlines():
            try:
                s = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if not isinstance(s, dict) or num(s.get("nfe")) is None:
                continue
            _add(sums, s, 1.0)
    return _cost_from_sums(sums) if sums["requests"] else None


def _leaves(task: str, group_subtasks: dict, seen=None) -> list[str]:
    seen = seen or set()
    subs = group_subtasks.get(task) or []
    if not subs or task in seen:
        return [task]
    seen.add(task)
    out = []
    for s in subs:
        out.extend(_leaves(s, group_subtasks, seen))
    return out


def _effective(n_samples, task: str) -> int:
    """``n-samples[task].effective`` as a count, 0 when the file does not hold one (a field of
    another shape, such as a bare number, is no count)."""
    entry = n_samples.get(task) if isinstance(n_samples, dict) else None
    n = num(entry.get("effective")) if isinstance(entry, dict) else None
    return int(n) if n is not None and n >= 0 else 0


def load_entries(path: Path, metric_choice: dict | None = None) -> list[Entry]:
    """Every task of one results file (a group with an accuracy of its own stands for its
    subtasks; one without is replaced by them). A field of an unexpected shape is a
    one-line :class:`ReportError` naming the file, never a traceback."""
    try:
        return _load_entries(path, metric_choice)
    except (TypeError, AttributeError, KeyError, ValueError, OverflowError, RecursionError) as exc:
        raise ReportError(f"{path}: malformed lm-eval results file ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc).strip() else ''})") from None


def _load_entries(path: Path, metric_choice: dict | None = None) -> list[Entry]:
    try:        # a regular file of bounded size: a FIFO named results_*.json never blocks
        r = read_json(path, MAX_RESULTS_BYTES, "lm-eval results file")
    except UnreadableFile as exc:
        raise ReportError(str(exc)) from None
    if not isinstance(r, dict) or not isinstance(r.get("results"), dict):
        raise ReportError(f"{path}: no 'results' (not an lm-eval results file)")
    metric_choice = metric_choice or {}
    cfg = r.get("config") or {}
    pvf = cfg.get("pvf") if isinstance(cfg.get("pvf"), dict) else {}
    totals = pvf.get("totals") if isinstance(pvf.get("totals"), dict) else {}
    run = ident.run_identity(r)
    results = r["results"]
    group_subtasks = r.get("group_subtasks") or {}
    scored = set()
    for g in group_subtasks:
        with _finite(path, g):
            if _accuracy(_metric_entries(results.get(g) or {}), g, metric_choice)[0] is not None:
                scored.add(g)
    hidden = {c for g in scored for c in (group_subtasks[g] or [])} | (set(group_subtasks) - scored)
    n_samples = r.get("n-samples") or {}
    stamp = re.sub(r"^results_", "", Path(path).stem)
    date = num(r.get("date")) or Path(path).stat().st_mtime
    out = []
    for task, res in results.items():
        if task in hidden or not isinstance(res, dict):
            continue
        entries = _metric_entries(res)
        leaves = _leaves(task, group_subtasks)
        with _finite(path, task):
            acc, se, acc_metric = _accuracy(entries, task, metric_choice)
            cost, source = _cost_from_metrics(entries, strict=bool(pvf)), "metrics"
            if cost is None and totals:
                cost, source = _cost_from_totals(totals, leaves), "totals"
        n = sum(_effective(n_samples, t) for t in leaves) or None
        if cost is None:
            files = [f for t in leaves for f in Path(path).parent.glob(f"samples_{t}_{stamp}.jsonl")]
            cost, source = _cost_from_samples(files), "samples"
        cost = cost or {}
        _impossible(path, task, acc, acc_metric, cost)
        if se is None and acc is not None and n and acc_metric.split(",")[0] in BINARY_METRICS:
            se = math.sqrt(acc * (1 - acc) / max(n - 1, 1))   # lm-eval's mean stderr of 0/1 scores
        run_part = {k: v for k, v in run.items() if k != "gen_length"}
        full = ident.full_identity(run_part,
                                   ident.task_identity(r, task, cost.get("gen_length"), run))
        e = Entry(Path(path), date, full, acc_metric=acc_metric, n=n,
                  acc=None if acc is None else 100.0 * acc,
                  acc_se=None if se is None or acc is None else 100.0 * se,
                  nfe=cost.get("nfe"), branch_rows=cost.get("branch_rows"), tpf=cost.get("tpf"),
                  tps=cost.get("tps"), edits=cost.get("edits"), remasks=cost.get("remasks"),
                  cost_source=source if cost else None,
                  batch_size=_batch_size(r), metrics=_metric_names(entries))
        out.append(e)
    return out


def _batch_size(r: dict) -> int | None:
    """The batch size a results dict ran with (``config.pvf``, else lm-eval's config)."""
    cfg = r.get("config") or {}
    pvf = cfg.get("pvf") if isinstance(cfg.get("pvf"), dict) else {}
    v = num(pvf.get("batch_size", cfg.get("batch_size")))
    return int(v) if v is not None and v == int(v) else None


def load(paths, metric_choice: dict | None = None) -> list[Entry]:
    """Entries of every ``results_*.json`` under ``paths`` (folders or files; those of a file
    named in ``paths`` are :attr:`Entry.named`)."""
    named = {Path(p) for p in paths if Path(p).is_file()}
    out = []
    for f in find_result_files(paths):
        for e in load_entries(f, metric_choice):
            e.named = f in named
            out.append(e)
    return out
