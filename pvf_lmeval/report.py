"""``pvf-report``: A leaderboard of lm-eval runs, with the paper's speedups (Tables 1-2, Pareto plot).

    pvf-report OUT/ [OUT2/ ...] [--format text|markdown|csv] [--plot accuracy-nfe pareto.png]
               [--check BASELINE.json [--acc-tol 1.0] [--cost-tol 0.05]] [--save-baseline FILE]

Input: lm-eval ``--output_path`` folders (searched recursively for ``results_*.json``; the
``samples_*.jsonl`` next to them are read only when a task's results lack cost metrics) or result
files. One row per (model, decoder, settings); settings are the ``--model_args`` other than the
checkpoint, decoder and device, plus ``--gen_kwargs``, ``--limit`` and the chat template. Runs of the
same row on different tasks merge into one row (for a task in several runs the newest wins).
One column group per task:

* ``acc``: the task's accuracy metric in percent (``exact_match``, the built-ins' ``strict-match``
  row first; ``--metric`` picks another), ``Δs``: change from the ``static`` run (points);
* ``NFE`` (mean model calls per request), ``TPF`` (tokens per forward), ``TPS`` (tokens per
  second), both ratios of sums;
* ``×s`` / ``×t``: speedup over the ``static`` / ``threshold`` (Fast-dLLM) run of the same model and
  budget: ``NFE_base / NFE`` for NFE, ``TPS / TPS_base`` for TPS (the paper's bracketed numbers).
  The ``threshold`` reference prefers the run with the same ``threshold`` as the row.

Costs come from the task's own metrics (the pvf task YAMLs), else from ``config.pvf.totals``
(``--model pvf-dlm`` on built-in tasks), else from per-sample fields; runs of other models
(``--model hf``) leave them empty. Exit status of ``--check``: 1 when something regressed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: ``--model_args`` keys that do not define a row (checkpoint and decoder are columns of their own)
NOT_SETTINGS = {"pretrained", "decoder", "device", "batch_size", "max_batch_size", "trace",
                "parallelize", "trust_remote_code"}
#: decoder-specific settings ignored when matching a row with its static/threshold reference
DECODER_SPECIFIC = {"plan_lo", "plan_hi", "ar_lo", "width", "reveal_next", "routes", "vocab",
                    "plan_vocab", "plan_self_check", "pick", "band", "draft_steps", "base_rule",
                    "preset", "factor", "steps", "seed"}
DECODER_ORDER = ["static", "threshold", "freedave", "pvf", "explore"]
#: accuracy metrics by preference, then filters by preference
ACC_METRICS = ["exact_match", "pass@1", "pass_at_1", "acc", "acc_norm", "math_verify", "f1"]
FILTER_ORDER = ["none", "strict-match", "custom-extract", "create_test", "flexible-extract"]
COST_KEYS = ("nfe", "gen_tokens", "wall_s")

COLUMNS = [  # (key, header in text/markdown)
    ("acc", "acc"),
    ("acc_delta_static", "Δs"),
    ("nfe", "NFE"),
    ("nfe_speedup_static", "NFE×s"),
    ("nfe_speedup_threshold", "NFE×t"),
    ("tpf", "TPF"),
    ("tps", "TPS"),
    ("tps_speedup_static", "TPS×s"),
    ("tps_speedup_threshold", "TPS×t"),
]
CSV_EXTRA = ["n", "acc_metric"]
PLOTS = {"accuracy-nfe": ("nfe", "NFE (mean model calls per request)", False),
         "accuracy-tps": ("tps", "tokens per second", True),
         "accuracy-tpf": ("tpf", "tokens per forward", True)}


class ReportError(Exception):
    """A user-facing error (bad input); printed without a traceback."""


# ----------------------------------------------------------------------------- reading


@dataclass
class TaskStats:
    acc: float | None = None           # percent
    acc_metric: str | None = None      # "exact_match,strict-match"
    n: int | None = None
    nfe: float | None = None
    tpf: float | None = None
    tps: float | None = None
    cost_source: str | None = None     # metrics | totals | samples


@dataclass
class Run:
    path: Path
    date: float
    model: str
    decoder: str
    settings: dict
    threshold: float | None
    tasks: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        return (self.model, self.decoder, settings_label(self.settings))


def _num(v) -> float | None:
    """A finite float, or None (missing, NaN, "N/A")."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _parse_args_string(s) -> dict:
    if isinstance(s, dict):
        return dict(s)
    out = {}
    for part in str(s or "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _fmt_value(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v)) if abs(v) >= 1 else str(v)
    if isinstance(v, (list, tuple)):
        return ":".join(_fmt_value(x) for x in v)
    return str(v)


def settings_label(settings: dict) -> str:
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in sorted(settings.items())) or "-"


def find_result_files(paths) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found = sorted(p.rglob("results_*.json"))
            if not found:
                raise ReportError(f"{p}: no results_*.json below this folder (an lm_eval --output_path?)")
            files.extend(found)
        else:
            raise ReportError(f"{p}: no such file or folder")
    return files


def _metric_entries(res: dict) -> dict:
    """``{"exact_match": {"strict-match": 0.5, ...}, ...}`` from one task's results."""
    out: dict = {}
    for key, value in res.items():
        if "," not in key or "_stderr" in key.split(",")[0]:
            continue
        metric, filt = key.split(",", 1)
        out.setdefault(metric, {})[filt] = value
    return out


def _pick(entries: dict, metric: str):
    """(value, "metric,filter") of ``metric`` in the preferred filter, or (None, None)."""
    by_filter = entries.get(metric)
    if not by_filter:
        return None, None
    order = FILTER_ORDER + sorted(f for f in by_filter if f not in FILTER_ORDER)
    for f in order:
        if f in by_filter and _num(by_filter[f]) is not None:
            return _num(by_filter[f]), f"{metric},{f}"
    return None, None


def _accuracy(entries: dict, task: str, metric_choice: dict) -> tuple:
    wanted = metric_choice.get(task) or metric_choice.get("*")
    if wanted:
        metric, _, filt = wanted.partition(",")
        if filt:
            v = _num(entries.get(metric, {}).get(filt))
            if v is not None:
                return v, wanted
        else:
            v, name = _pick(entries, metric)
            if v is not None:
                return v, name
        if task in metric_choice:
            return None, None
    for metric in ACC_METRICS:
        v, name = _pick(entries, metric)
        if v is not None:
            return v, name
    return None, None


def _cost_from_metrics(entries: dict) -> dict | None:
    nfe, _ = _pick(entries, "nfe")
    if nfe is None:
        return None
    gen_tokens, _ = _pick(entries, "gen_tokens")
    wall, _ = _pick(entries, "wall_s")
    tpf, _ = _pick(entries, "tpf")
    tps, _ = _pick(entries, "tps")
    # rates are ratios of sums: with equal counts, ratio of the means
    if tpf is None and gen_tokens is not None and nfe:
        tpf = gen_tokens / nfe
    if tps is None and gen_tokens is not None and wall:
        tps = gen_tokens / wall
    return {"nfe": nfe, "tpf": tpf, "tps": tps}


def _sums_from_totals(totals: dict, names: list[str]) -> dict | None:
    """Summed statistics of ``names`` from ``config.pvf.totals`` (means x requests)."""
    sums = {"requests": 0.0, **{k: 0.0 for k in COST_KEYS}}
    found = False
    for name in names:
        row = totals.get(name)
        if not isinstance(row, dict) or not _num(row.get("requests")):
            continue
        n = _num(row["requests"])
        vals = {k: _num(row.get(k)) for k in COST_KEYS}
        if vals["nfe"] is None:
            continue
        found = True
        sums["requests"] += n
        for k, v in vals.items():
            sums[k] += (v or 0.0) * n
    return sums if found else None


def _cost_from_sums(sums: dict) -> dict:
    n = sums["requests"]
    return {"nfe": sums["nfe"] / n if n else None,
            "tpf": sums["gen_tokens"] / sums["nfe"] if sums["nfe"] else None,
            "tps": sums["gen_tokens"] / sums["wall_s"] if sums["wall_s"] else None}


def _cost_from_samples(files: list[Path]) -> dict | None:
    sums = {"requests": 0.0, **{k: 0.0 for k in COST_KEYS}}
    for f in files:
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                s = json.loads(line)
            except json.JSONDecodeError:
                continue
            meta = s if _num(s.get("nfe")) is not None else None
            if meta is None:  # statistics a model may have put into the request's gen_kwargs
                args = (s.get("arguments") or {}).get("gen_args_0", {}).get("arg_1")
                meta = next((args[k] for k in ("pvf_stats", "meta") if isinstance(args, dict)
                             and isinstance(args.get(k), dict)), None)
            if meta is None or _num(meta.get("nfe")) is None:
                continue
            sums["requests"] += 1
            for k in COST_KEYS:
                sums[k] += _num(meta.get(k)) or 0.0
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


def load_run(path: Path, metric_choice: dict | None = None) -> Run:
    try:
        r = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a readable lm-eval results file ({exc})") from None
    if not isinstance(r, dict) or "results" not in r:
        raise ReportError(f"{path}: no 'results' (not an lm-eval results file)")
    metric_choice = metric_choice or {}
    cfg = r.get("config") or {}
    pvf = cfg.get("pvf") if isinstance(cfg.get("pvf"), dict) else {}
    model_args = _parse_args_string(cfg.get("model_args"))
    model_type = str(cfg.get("model") or r.get("model_source") or "?")
    model = str(pvf.get("pretrained") or model_args.get("pretrained") or r.get("model_name") or model_type)
    decoder = str(pvf.get("decoder") or (model_args.get("decoder") or "threshold"
                                         if model_type == "pvf-dlm" else model_type))
    settings = {k: v for k, v in model_args.items() if k not in NOT_SETTINGS}
    gen_kwargs = _parse_args_string(cfg.get("gen_kwargs"))
    settings.update(gen_kwargs)
    if cfg.get("limit") is not None:
        settings["limit"] = cfg["limit"]
    if r.get("chat_template"):
        settings["chat"] = "yes"
    if r.get("system_instruction"):
        settings["system"] = str(r.get("system_instruction_sha") or "yes")[:8]
    params = pvf.get("params") if isinstance(pvf.get("params"), dict) else {}
    threshold = _num(gen_kwargs.get("threshold", params.get("threshold", model_args.get("threshold"))))
    if decoder == "static" or (not params and "threshold" not in model_args):
        threshold = None
    # the sweep variable is always part of a pvf-dlm row (explicit or default), never of static's
    settings.pop("threshold", None)
    if threshold is not None:
        settings["threshold"] = threshold

    results = r.get("results") or {}
    group_subtasks = r.get("group_subtasks") or {}
    # a group with an accuracy of its own stands for its subtasks; one without is replaced by them
    scored = {g for g in group_subtasks
              if _accuracy(_metric_entries(results.get(g) or {}), g, metric_choice)[0] is not None}
    children = {c for g in scored for c in (group_subtasks[g] or [])}
    hidden = children | (set(group_subtasks) - scored)
    n_samples = r.get("n-samples") or {}
    totals = pvf.get("totals") if isinstance(pvf.get("totals"), dict) else {}
    stamp = re.sub(r"^results_", "", Path(path).stem)
    run = Run(Path(path), _num(r.get("date")) or Path(path).stat().st_mtime, model, decoder,
              settings, threshold)
    for task, res in results.items():
        if task in hidden or not isinstance(res, dict):
            continue
        entries = _metric_entries(res)
        acc, acc_metric = _accuracy(entries, task, metric_choice)
        leaves = _leaves(task, group_subtasks)
        n = sum(int(_num((n_samples.get(t) or {}).get("effective")) or 0) for t in leaves) or None
        stats = TaskStats(acc=None if acc is None else 100.0 * acc, acc_metric=acc_metric, n=n)
        cost, source = _cost_from_metrics(entries), "metrics"
        if cost is None and totals:
            sums = _sums_from_totals(totals, leaves)
            cost, source = (_cost_from_sums(sums), "totals") if sums else (None, None)
        if cost is None:
            files = [f for t in leaves for f in Path(path).parent.glob(f"samples_{t}_{stamp}.jsonl")]
            cost, source = _cost_from_samples(files), "samples"
        if cost is not None:
            stats.nfe, stats.tpf, stats.tps = cost["nfe"], cost["tpf"], cost["tps"]
            stats.cost_source = source
        run.tasks[task] = stats
    return run


# ----------------------------------------------------------------------------- table


@dataclass
class Row:
    model: str
    decoder: str
    settings: dict
    threshold: float | None
    tasks: dict                     # task -> TaskStats
    cells: dict = field(default_factory=dict)   # task -> {column key: value}

    @property
    def key(self) -> tuple:
        return (self.model, self.decoder, settings_label(self.settings))

    @property
    def label(self) -> str:
        return settings_label(self.settings)


def merge_runs(runs: list[Run]) -> list[Row]:
    rows: dict = {}
    for run in sorted(runs, key=lambda r: r.date):  # newer runs overwrite older ones per task
        row = rows.get(run.key)
        if row is None:
            row = rows[run.key] = Row(run.model, run.decoder, dict(run.settings), run.threshold, {})
        row.tasks.update(run.tasks)
    return sorted(rows.values(), key=_row_order)


def _row_order(row: Row):
    dec = DECODER_ORDER.index(row.decoder) if row.decoder in DECODER_ORDER else len(DECODER_ORDER)
    thr = -(row.threshold if row.threshold is not None else 2.0)
    return (row.model, dec, row.decoder, thr, row.label)


def _budget(settings: dict, ignore: set) -> dict:
    return {k: str(v) for k, v in settings.items() if k not in DECODER_SPECIFIC and k not in ignore}


def _reference(row: Row, rows: list[Row], decoder: str, task: str, need: str) -> Row | None:
    """The ``decoder`` row of the same model that is closest to ``row``'s budget settings."""
    ignore = {"threshold"} if decoder == "static" else set()
    mine = _budget(row.settings, ignore | ({"threshold"} if row.decoder == "static" else set()))
    best, best_score = None, None
    for cand in rows:
        if cand.model != row.model or cand.decoder != decoder or cand is row:
            continue
        st = cand.tasks.get(task)
        if st is None or getattr(st, need) is None:
            continue
        theirs = _budget(cand.settings, ignore)
        keys = (set(mine) | set(theirs)) - {"threshold"}
        score = sum(mine.get(k) != theirs.get(k) for k in keys)
        if decoder == "threshold":
            score += 0.5 * (cand.threshold != (row.threshold if row.threshold is not None else 0.9))
        if best_score is None or score < best_score:
            best, best_score = cand, score
    return best


def compute_cells(rows: list[Row], tasks: list[str]) -> None:
    for row in rows:
        for task in tasks:
            st = row.tasks.get(task)
            c = dict.fromkeys([k for k, _ in COLUMNS] + CSV_EXTRA)
            row.cells[task] = c
            if st is None:
                continue
            c.update(acc=st.acc, nfe=st.nfe, tpf=st.tpf, tps=st.tps, n=st.n, acc_metric=st.acc_metric)
            for base in ("static", "threshold"):
                if row.decoder == base:
                    continue
                if base == "static":
                    ref = _reference(row, rows, base, task, "acc")
                    if ref is not None and st.acc is not None:
                        c["acc_delta_static"] = st.acc - ref.tasks[task].acc
                ref = _reference(row, rows, base, task, "nfe")
                if ref is not None and st.nfe:
                    c[f"nfe_speedup_{base}"] = ref.tasks[task].nfe / st.nfe
                ref = _reference(row, rows, base, task, "tps")
                if ref is not None and st.tps is not None and ref.tasks[task].tps:
                    c[f"tps_speedup_{base}"] = st.tps / ref.tasks[task].tps


def task_columns(rows: list[Row], only: list[str] | None = None) -> list[str]:
    seen: list[str] = []
    for row in rows:
        for t in row.tasks:
            if t not in seen:
                seen.append(t)
    if only:
        missing = [t for t in only if t not in seen]
        if missing:
            raise ReportError(f"--tasks: no results for {', '.join(missing)} "
                              f"(have: {', '.join(seen) or 'none'})")
        return list(only)
    return sorted(seen)


def build(paths, metric_choice: dict | None = None, only_tasks=None) -> tuple[list[Row], list[str]]:
    runs = [load_run(p, metric_choice) for p in find_result_files(paths)]
    rows = merge_runs(runs)
    tasks = task_columns(rows, only_tasks)
    compute_cells(rows, tasks)
    return rows, tasks


def _fmt(key: str, v) -> str:
    if v is None:
        return ""
    if key == "acc_delta_static":
        return f"{v:+.2f}"
    if "speedup" in key:
        return f"{v:.2f}x"
    if key in ("n", "acc_metric"):
        return str(v)
    return f"{v:.2f}"


def render(rows: list[Row], tasks: list[str], fmt: str = "text") -> str:
    lead = ["model", "decoder", "settings"]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        keys = [k for k, _ in COLUMNS] + CSV_EXTRA
        w.writerow(lead + [f"{t}:{k}" for t in tasks for k in keys])
        for row in rows:
            vals = [row.model, row.decoder, row.label]
            for t in tasks:
                c = row.cells[t]
                vals += ["" if c[k] is None else (f"{c[k]:.6g}" if isinstance(c[k], float) else c[k])
                         for k in keys]
            w.writerow(vals)
        return buf.getvalue()
    body = [[row.model, row.decoder, row.label]
            + [_fmt(k, row.cells[t][k]) for t in tasks for k, _ in COLUMNS] for row in rows]
    if fmt == "markdown":
        head = lead + [f"{t} {h}" for t in tasks for _, h in COLUMNS]
        align = ["---"] * len(lead) + ["---:"] * (len(head) - len(lead))
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines) + "\n"
    # text: a task header line spanning each column group
    head = lead + [h for _ in tasks for _, h in COLUMNS]
    widths = [max(len(head[i]), *(len(r[i]) for r in body)) if body else len(head[i])
              for i in range(len(head))]
    ncol = len(COLUMNS)
    for j, t in enumerate(tasks):  # widen a group so that its task name fits
        span = slice(len(lead) + j * ncol, len(lead) + (j + 1) * ncol)
        need = len(t) - (sum(widths[span]) + 2 * (ncol - 1))
        if need > 0:
            widths[span.stop - 1] += need
    sep = "  "
    group = [" " * widths[i] for i in range(len(lead))]
    for j, t in enumerate(tasks):
        span = widths[len(lead) + j * ncol: len(lead) + (j + 1) * ncol]
        group.append(t.center(sum(span) + len(sep) * (ncol - 1), "-" if len(t) + 2 < sum(span) else " "))
    lines = [sep.join(group).rstrip(),
             sep.join(h.ljust(widths[i]) if i < len(lead) else h.rjust(widths[i])
                      for i, h in enumerate(head)).rstrip()]
    for r in body:
        lines.append(sep.join(v.ljust(widths[i]) if i < len(lead) else v.rjust(widths[i])
                              for i, v in enumerate(r)).rstrip())
    legend = ("acc: accuracy (%), Δs: change from static (points); NFE: model calls per request; "
              "TPF/TPS: tokens per forward/second; ×s, ×t: speedup over the static / threshold run "
              "of the same model")
    return "\n".join(lines) + "\n\n" + legend + "\n"


# ----------------------------------------------------------------------------- baseline / check


def baseline_dict(rows: list[Row], tasks: list[str]) -> dict:
    return {"pvf_report_baseline": 1, "rows": [
        {"model": r.model, "decoder": r.decoder, "settings": r.label,
         "tasks": {t: {"acc": r.cells[t]["acc"], "nfe": r.cells[t]["nfe"], "tpf": r.cells[t]["tpf"],
                       "tps": r.cells[t]["tps"], "n": r.cells[t]["n"],
                       "acc_metric": r.cells[t]["acc_metric"]}
                   for t in tasks if r.tasks.get(t) is not None}}
        for r in rows]}


def check(rows: list[Row], baseline: dict, acc_tol: float = 1.0, cost_tol: float = 0.05,
          metrics=("acc", "nfe", "tps")) -> tuple[list[list[str]], list[str]]:
    """Regressions (table rows) and notes against a baseline written by ``--save-baseline``."""
    if not isinstance(baseline, dict) or not isinstance(baseline.get("rows"), list):
        raise ReportError("--check: not a pvf-report baseline (write one with --save-baseline)")
    current = {r.key: r for r in rows}
    bad, notes = [], []
    for b in baseline["rows"]:
        key = (b.get("model"), b.get("decoder"), b.get("settings"))
        row = current.get(key)
        label = f"{key[0]} {key[1]} {key[2]}"
        if row is None:
            notes.append(f"not in these runs: {label}")
            continue
        for task, base in (b.get("tasks") or {}).items():
            st = row.tasks.get(task)
            if st is None:
                notes.append(f"not in these runs: {label} / {task}")
                continue
            now = {"acc": st.acc, "nfe": st.nfe, "tps": st.tps, "tpf": st.tpf}
            for m in metrics:
                old, new = _num(base.get(m)), now.get(m)
                if old is None:
                    continue
                if new is None:
                    bad.append([label, task, m, f"{old:.2f}", "missing", "", ""])
                    continue
                if m == "acc":
                    worse, change, tol = new < old - acc_tol, f"{new - old:+.2f} pts", f"-{acc_tol:g} pts"
                elif m == "nfe":
                    worse = new > old * (1 + cost_tol)
                    change, tol = f"{(new / old - 1) * 100:+.1f}%" if old else "", f"+{cost_tol * 100:g}%"
                else:  # tps, tpf: higher is better
                    worse = new < old * (1 - cost_tol)
                    change, tol = f"{(new / old - 1) * 100:+.1f}%" if old else "", f"-{cost_tol * 100:g}%"
                if worse:
                    bad.append([label, task, m, f"{old:.2f}", f"{new:.2f}", change, tol])
    return bad, notes


def _table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    fmt = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body])


# ----------------------------------------------------------------------------- plot


def _pareto(points, higher_x_better: bool):
    """Non-dominated (x, acc) points, sorted by x."""
    pts = sorted(points, key=lambda p: (p[0], -p[1]))
    if higher_x_better:
        pts = pts[::-1]
    front, best = [], -math.inf
    for p in pts:
        if p[1] > best:
            front.append(p)
            best = p[1]
    return sorted(front, key=lambda p: p[0])


def plot(rows: list[Row], tasks: list[str], kind: str, out: str) -> Path:
    if kind not in PLOTS:
        raise ReportError(f"--plot {kind!r}: one of {', '.join(PLOTS)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install 'pvf-lmeval[plot]'") from None
    xkey, xlabel, higher = PLOTS[kind]
    # settings shared by every row go to the title, the rest label the curves
    common = dict(rows[0].settings) if rows else {}
    for row in rows[1:]:
        common = {k: v for k, v in common.items() if str(row.settings.get(k)) == str(v)}
    common.pop("threshold", None)
    models = sorted({r.model for r in rows})
    ncols = max(1, len(tasks))
    fig, axes = plt.subplots(1, ncols, figsize=(max(6.0, 4.8 * ncols), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks or ["(no tasks)"]):
        curves: dict = {}
        for row in rows:
            c = row.cells.get(task) or {}
            if c.get("acc") is None or c.get(xkey) is None:
                continue
            rest = {k: v for k, v in row.settings.items() if k != "threshold" and k not in common}
            name = row.decoder + (f" [{settings_label(rest)}]" if rest else "")
            if len(models) > 1:
                name = f"{row.model}: {name}"
            curves.setdefault(name, []).append((c[xkey], c["acc"], row.threshold))
        for name, pts in sorted(curves.items()):
            pts.sort(key=lambda p: (p[0], p[1]))
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", alpha=0.4)[0]
            front = _pareto(pts, higher)
            ax.plot([p[0] for p in front], [p[1] for p in front], "-o", color=line.get_color(),
                    label=name)
            for x, y, thr in pts:
                if thr is not None and len(pts) > 1:
                    ax.annotate(f"{thr:g}", (x, y), textcoords="offset points", xytext=(3, 4),
                                fontsize=7, color=line.get_color())
        ax.set_title(task)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        if curves:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no runs with accuracy and {xkey}", ha="center", va="center",
                    transform=ax.transAxes)
    title = f"accuracy vs {xkey.upper()}: Pareto front per decoder, points labelled with the threshold"
    sub = " ".join(([models[0]] if len(models) == 1 else []) + ([settings_label(common)] if common else []))
    fig.suptitle(title + (f"\n{sub}" if sub else ""), fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- CLI


def _metric_choice(values) -> dict:
    out = {}
    for v in values or []:
        task, sep, metric = v.partition("=")
        if sep:
            out[task] = metric
        else:
            out["*"] = v
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pvf-report", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="columns: acc (%%), Δs change from static (points), NFE, TPF, TPS, ×s / ×t speedups "
               "over the static / threshold run of the same model (NFE_base/NFE, TPS/TPS_base)")
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="lm_eval --output_path folders or results files")
    p.add_argument("--format", choices=["text", "markdown", "csv"], default="text")
    p.add_argument("-o", "--output", help="write the table to this file instead of stdout")
    p.add_argument("--tasks", help="comma-separated task columns (default: all)")
    p.add_argument("--metric", action="append", metavar="[TASK=]METRIC[,FILTER]",
                   help="accuracy metric, e.g. exact_match_flexible or gsm8k=exact_match,flexible-extract")
    p.add_argument("--plot", nargs=2, metavar=("KIND", "OUT"),
                   help=f"write a plot (matplotlib): KIND in {', '.join(PLOTS)}")
    p.add_argument("--check", metavar="BASELINE.json", help="exit 1 on regressions against this baseline")
    p.add_argument("--acc-tol", type=float, default=1.0, help="accuracy drop allowed, absolute points (1.0)")
    p.add_argument("--cost-tol", type=float, default=0.05,
                   help="relative NFE rise / TPS fall allowed (0.05)")
    p.add_argument("--check-metrics", default="acc,nfe,tps",
                   help="what --check compares (acc,nfe,tps,tpf; default acc,nfe,tps)")
    p.add_argument("--save-baseline", metavar="FILE", help="write these results as a --check baseline")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        only = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
        rows, tasks = build(args.paths, _metric_choice(args.metric), only)
        table = render(rows, tasks, args.format)
        if args.output:
            Path(args.output).write_text(table)
        else:
            sys.stdout.write(table)
        if args.plot:
            out = plot(rows, tasks, args.plot[0], args.plot[1])
            print(f"pvf-report: wrote {out}", file=sys.stderr)
        if args.save_baseline:
            Path(args.save_baseline).write_text(json.dumps(baseline_dict(rows, tasks), indent=1) + "\n")
            print(f"pvf-report: wrote baseline {args.save_baseline}", file=sys.stderr)
        if args.check:
            try:
                baseline = json.loads(Path(args.check).read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ReportError(f"--check {args.check}: {exc}") from None
            metrics = [m.strip() for m in args.check_metrics.split(",") if m.strip()]
            unknown = set(metrics) - {"acc", "nfe", "tps", "tpf"}
            if unknown:
                raise ReportError(f"--check-metrics: unknown {', '.join(sorted(unknown))}")
            bad, notes = check(rows, baseline, args.acc_tol, args.cost_tol, metrics)
            for n in notes:
                print(f"pvf-report: note: {n}", file=sys.stderr)
            if bad:
                print(f"\npvf-report: {len(bad)} regression(s) against {args.check}:")
                print(_table(["row", "task", "metric", "baseline", "now", "change", "allowed"], bad))
                return 1
            print(f"pvf-report: check passed against {args.check}", file=sys.stderr)
    except ReportError as exc:
        print(f"pvf-report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
