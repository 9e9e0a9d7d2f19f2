"""The regression gate: ``--save-baseline`` and ``--check``.

A baseline holds, per result, its full identity and what it measured; it is the trusted side:
what the checked runs may move, it fixes. ``--save-baseline`` refuses a result without an
accuracy (name the metric with ``--metric``) and two results of one identity. ``--check``
refuses a baseline that is empty or holds an impossible value (:func:`baseline_entries`) and
checked runs with two results of one identity (a file's own date cannot choose between
them) and a result of an identity the baseline does not hold found in a folder (the baseline's
own file left beside a run whose setting changed would pass in its place; a results file named
on the command line is the user's choice, checked or not), then matches every baseline result
with the current result of the same identity and fails when

* a baseline result has no counterpart (unless ``--allow-missing``): a changed setting must not
  make the gate pass by matching nothing;
* the current result's accuracy is another metric or filter than the baseline's, or is
  missing, or its sample count differs from the baseline's;
* accuracy dropped by more than ``acc_tol`` points *and* by more than ``z`` standard errors of
  the difference of two runs of the baseline's size (:func:`noise_se`: from the baseline's
  accuracy and sample count, never from the checked file's own standard error), so that
  identical reruns pass and a drop inside the noise of a small sample does not fail;
* NFE or branch rows per request rose by more than ``cost_tol`` (relative; 0 = any rise, which
  suits deterministic decoding);
* with ``check_speed``: tokens per second *relative to a reference decoder measured in the same
  runs* (``TPS / TPS_ref``, so the machine's speed cancels) fell by more than ``speed_tol``.

A baseline result whose accuracy check cannot fail (:func:`blind`: the drop it allows reaches
its accuracy, so that a result of 0 passes) is listed by the command line, which refuses the
check unless told to accept it.
"""

from __future__ import annotations

import math

from ...decoding.registry import REFERENCE_DECODERS
from ...lmeval import identity as ident
from .compare import Table, describe
from .runs import BINARY_METRICS, ReportError, UsageError, num

FORMAT = 3
#: relative slack for comparing means of integers that were summed in another order
EPS = 1e-9


def refuse_duplicates(table: Table, option: str) -> None:
    """A :class:`UsageError` when the runs hold two results of one identity: which of them
    counts must not rest on anything a results file states about itself (its date)."""
    if table.duplicates:
        group = table.duplicates[0]
        raise UsageError(f"{option}: {len(group)} results of {describe(group[-1].identity)} "
                         f"({', '.join(str(e.path) for e in group)}); the gate takes one result "
                         f"per run: pass only the run to compare")


def baseline_dict(table: Table) -> dict:
    """The baseline of ``table``'s results; a :class:`UsageError` for a result without an
    accuracy (it would check nothing) or two results of one identity."""
    refuse_duplicates(table, "--save-baseline")
    out = []
    for row in table.rows:
        for col in table.columns:
            e = row.entries.get(col.key)
            if e is None:
                continue
            if e.acc is None:
                have = ", ".join(e.metrics) or "none"
                raise UsageError(f"--save-baseline: {describe(e.identity)} has no accuracy metric "
                                 f"pvf-report knows (its metrics: {have}); name one with --metric "
                                 f"{e.task}=METRIC,FILTER")
            speed = {}
            for base in REFERENCE_DECODERS:
                ratio = row.cells[col.key].get(f"tps_speedup_{base}")
                if ratio is not None:
                    speed[base] = ratio
            out.append({"identity": e.identity, "acc": e.acc, "acc_se": e.acc_se, "n": e.n,
                        "acc_metric": e.acc_metric, "nfe": e.nfe, "branch_rows": e.branch_rows,
                        "tpf": e.tpf, "tps": e.tps, "tps_ratio": speed,
                        "batch_size": e.batch_size})
    return {"pvf_report_baseline": FORMAT, "entries": out}


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _entry_problem(b) -> str | None:
    """What makes baseline entry ``b`` unusable (None: nothing)."""
    if not isinstance(b, dict):
        return f"{_show(b)} is not an object"
    identity = b.get("identity")
    if not isinstance(identity, dict) or not all(isinstance(identity.get(k), str)
                                                 for k in ("model", "decoder", "task")):
        return "identity must be an object naming the model, decoder and task"
    metric = b.get("acc_metric")
    if not isinstance(metric, str) or metric.count(",") < 1:
        return f"acc_metric={_show(metric)} must be METRIC,FILTER"
    binary = metric.split(",")[0] in BINARY_METRICS
    acc = b.get("acc")
    if not _finite(acc) or (binary and not 0 <= acc <= 100):
        return f"acc={_show(acc)} must be a finite number" + (" in [0, 100]" if binary else "")
    n = b.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        return f"n={_show(n)} must be a positive integer or null"
    for k, low in (("acc_se", 0), ("nfe", 1), ("branch_rows", 1)):
        v = b.get(k)
        if v is not None and not (_finite(v) and v >= low):
            return f"{k}={_show(v)} must be a finite number >= {low} or null"
    ratios = b.get("tps_ratio") or {}
    if not isinstance(ratios, dict) or not all(_finite(v) and v > 0 for v in ratios.values()):
        return f"tps_ratio={_show(ratios)} must map reference decoders to positive numbers"
    return None


def baseline_entries(baseline) -> list[dict]:
    """The entries of a ``--check`` baseline, each usable; a one-line :class:`ReportError`
    (invalid input) naming the first problem: not a baseline, another format, no entries (it
    would pass any run), an entry with an impossible value, two entries of one identity."""
    if not isinstance(baseline, dict) or "pvf_report_baseline" not in baseline:
        raise ReportError("--check: not a pvf-report baseline (write one with --save-baseline)")
    if baseline["pvf_report_baseline"] != FORMAT or not isinstance(baseline.get("entries"), list):
        raise ReportError(f"--check: baseline format {baseline['pvf_report_baseline']!r} is not "
                          f"{FORMAT} (identities with device kind and batch size); write it again with "
                          "--save-baseline")
    entries = baseline["entries"]
    if not entries:
        raise ReportError("--check: the baseline holds no results (it would pass any run); write "
                          "it again with --save-baseline")
    seen = set()
    for i, b in enumerate(entries, 1):
        problem = _entry_problem(b)
        if problem is None:
            key = ident.key_of(b["identity"])
            problem = "a second result of the same identity" if key in seen else None
            seen.add(key)
        if problem is not None:
            raise ReportError(f"--check: baseline entry {i}: {problem}; write the baseline again "
                              f"with --save-baseline")
    return entries


def noise_se(b: dict) -> float:
    """One run's standard error of baseline entry ``b``'s accuracy, in points: for a metric
    scored 0 or 1 per item, that of the baseline's mean over its ``n`` items (lm-eval's mean
    standard error, ``sqrt(p (1 - p) / (n - 1))``); for another metric, or without ``n``, the
    standard error the baseline recorded (0 without one)."""
    p, n = b["acc"] / 100.0, b.get("n")
    if b["acc_metric"].split(",")[0] in BINARY_METRICS and n:
        return 100.0 * math.sqrt(p * (1.0 - p) / max(n - 1, 1))
    return b.get("acc_se") or 0.0


def allowed_drop(b: dict, acc_tol: float, z: float) -> float:
    """The largest accuracy drop (points) that passes for baseline entry ``b``: ``acc_tol``, or
    ``z`` standard errors of the difference of two runs of the baseline's size, the larger."""
    return max(acc_tol, z * math.sqrt(2.0) * noise_se(b))


def blind(entries: list[dict], acc_tol: float, z: float) -> list[str]:
    """The baseline entries whose accuracy check cannot fail, each as ``name: accuracy, allowed
    drop``: the drop they allow reaches their accuracy (a metric of values >= 0), so that a
    result of 0 passes: too few items for the noise bound, an accuracy of 0, a tolerance as
    large as the accuracy."""
    out = []
    for b in entries:
        drop = allowed_drop(b, acc_tol, z)
        if 0 <= b["acc"] <= drop:
            out.append(f"{describe(b['identity'])}: accuracy {b['acc']:.2f}, allowed drop "
                       f"{drop:.2f} pts")
    return out


def _nearest(identity: dict, others: list[dict], reverse: bool = False) -> str:
    """How the closest of ``others`` of the same model and task differs from ``identity``
    (``reverse``: how ``identity`` differs from it); empty if none."""
    same = [c for c in others if c.get("task") == identity.get("task")
            and c.get("model") == identity.get("model")]
    if not same:
        return ""
    best = min(same, key=lambda c: len(ident.differences(identity, c)))
    return "; ".join(ident.differences(best, identity) if reverse
                     else ident.differences(identity, best))


def refuse_unchecked(current: list, entries: list[dict]) -> None:
    """A one-line :class:`ReportError` (invalid input) for the first of ``current`` (entries)
    that no baseline entry matches and that was found in a folder rather than named: the gate
    would pass without checking it (module docstring)."""
    held = {ident.key_of(b["identity"]) for b in entries}
    for e in current:
        if e.named or ident.key_of(e.identity) in held:
            continue
        near = _nearest(e.identity, [b["identity"] for b in entries], reverse=True)
        raise ReportError(f"--check: {e.path}: {describe(e.identity)} is not in the baseline"
                          + (f" (the nearest baseline result differs in {near})" if near else "")
                          + ": the gate would not check it; pass only the runs to check, or name "
                            "its results file to check the others beside it")


def check(table: Table, baseline: dict, *, acc_tol: float = 1.0, z: float = 2.0,
          cost_tol: float = 0.0, check_speed: bool = False, speed_ref: str = "threshold",
          speed_tol: float = 0.10) -> tuple[list[list[str]], list[str], list[str]]:
    """(regressions as table rows, baseline results without a counterpart, notes). A baseline
    that :func:`baseline_entries` refuses, or runs with two results of one identity, raise."""
    entries = baseline_entries(baseline)
    refuse_duplicates(table, "--check")
    current = {}
    for row in table.rows:
        for col in table.columns:
            e = row.entries.get(col.key)
            if e is not None:
                current[ident.key_of(e.identity)] = (row, col, e)
    refuse_unchecked([e for _, _, e in current.values()], entries)
    bad: list[list[str]] = []
    missing: list[str] = []
    matched = set()
    for b in entries:
        bid = b["identity"]
        key = ident.key_of(bid)
        name = describe(bid)
        if key not in current:
            near = _nearest(bid, [e.identity for _, _, e in current.values()])
            missing.append(name + (f"\n    nearest run differs in {near}" if near else ""))
            continue
        matched.add(key)
        row, col, e = current[key]
        bad += _acc(name, b, e, acc_tol, z)
        for m in ("nfe", "branch_rows"):
            old, new = b.get(m), getattr(e, m)
            if old is None:
                continue
            if new is None:
                bad.append([name, m, f"{old:.2f}", "missing", "", ""])
            elif new > old * (1 + cost_tol + EPS):     # a baseline's costs are >= 1
                change = f"{(new / old - 1) * 100:+.1f}%"
                bad.append([name, m, f"{old:.2f}", f"{new:.2f}", change, f"+{cost_tol * 100:g}%"])
        if check_speed:
            bad += _speed(name, b, row, col, speed_ref, speed_tol)
    notes = [f"not in the baseline: {describe(e.identity)}"
             for k, (_, _, e) in current.items() if k not in matched]
    return bad, missing, notes


def _acc(name: str, b: dict, e, acc_tol: float, z: float) -> list[list[str]]:
    old, metric = b["acc"], b["acc_metric"]
    if e.acc_metric != metric:      # another metric, filter, or none (missing, NaN)
        return [[name, "acc_metric", metric, e.acc_metric or "missing", "", "the same"]]
    bad = []
    if b.get("n") is not None and e.n != b["n"]:
        bad.append([name, "n", str(b["n"]), "missing" if e.n is None else str(e.n), "",
                    "the same"])
    drop = old - e.acc
    if drop > allowed_drop(b, acc_tol, z):
        se = math.sqrt(2.0) * noise_se(b)   # the difference of two runs like the baseline's
        allowed = f"-{acc_tol:g} pts and -{z:g} se ({z * se:.2f} pts)"
        bad.append([name, "acc", f"{old:.2f}", f"{e.acc:.2f}", f"{-drop:+.2f} pts", allowed])
    return bad


def _speed(name: str, b: dict, row, col, ref_decoder: str, tol: float) -> list[list[str]]:
    if row.decoder == ref_decoder:
        return []
    old = num((b.get("tps_ratio") or {}).get(ref_decoder))
    if old is None:
        return [[name, f"tps/{ref_decoder}", "no reference", "", "", ""]]
    # the table holds the ratio only where the runs have a reference decoder's result
    new = row.cells[col.key].get(f"tps_speedup_{ref_decoder}")
    if new is None:
        return [[name, f"tps/{ref_decoder}", f"{old:.2f}x", f"no {ref_decoder} run", "", ""]]
    if new < old * (1 - tol):
        old_bs, new_bs = b.get("batch_size"), row.entries[col.key].batch_size
        change = f"{(new / old - 1) * 100:+.1f}%"
        if old_bs and new_bs and old_bs != new_bs:    # the speed moved with the batch size too
            change += f" (batch {old_bs} -> {new_bs})"
        return [[name, f"tps/{ref_decoder}", f"{old:.2f}x", f"{new:.2f}x", change,
                 f"-{tol * 100:g}%"]]
    return []


def table_text(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]

    def fmt(r):
        return "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()

    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body])
