"""The regression gate: ``--save-baseline`` and ``--check``.

A baseline holds, per result, its full identity and what it measured. ``--check`` matches every
baseline result with the current result of the same identity and fails (exit 1) when

* a baseline result has no counterpart (unless ``--allow-missing``): a changed setting must not
  make the gate pass by matching nothing;
* accuracy dropped by more than ``acc_tol`` points *and* by more than ``z`` standard errors of the
  difference (two independent means: ``sqrt(se_base² + se_now²)``), so that identical reruns pass
  and a drop inside the noise of a small sample does not fail;
* NFE or branch rows per request rose by more than ``cost_tol`` (relative; 0 = any rise, which
  suits deterministic decoding);
* with ``check_speed``: tokens per second *relative to a reference decoder measured in the same
  runs* (``TPS / TPS_ref``, so the machine's speed cancels) fell by more than ``speed_tol``.
"""

from __future__ import annotations

import math

from ...decoder_names import REFERENCE_DECODERS
from . import identity as ident
from .compare import Table, describe
from .runs import ReportError, num

FORMAT = 3
#: relative slack for comparing means of integers that were summed in another order
EPS = 1e-9


def baseline_dict(table: Table) -> dict:
    out = []
    for row in table.rows:
        for col in table.columns:
            e = row.entries.get(col.key)
            if e is None:
                continue
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


def _nearest(identity: dict, current: list[dict]) -> str:
    """How the closest current result of the same model and task differs (empty if none)."""
    same = [c for c in current if c.get("task") == identity.get("task")
            and c.get("model") == identity.get("model")]
    if not same:
        return ""
    best = min(same, key=lambda c: len(ident.differences(identity, c)))
    return "; ".join(ident.differences(identity, best))


def check(table: Table, baseline: dict, *, acc_tol: float = 1.0, z: float = 2.0,
          cost_tol: float = 0.0, check_speed: bool = False, speed_ref: str = "threshold",
          speed_tol: float = 0.10) -> tuple[list[list[str]], list[str], list[str]]:
    """(regressions as table rows, baseline results without a counterpart, notes)."""
    if not isinstance(baseline, dict) or "pvf_report_baseline" not in baseline:
        raise ReportError("--check: not a pvf-report baseline (write one with --save-baseline)")
    if baseline["pvf_report_baseline"] != FORMAT or not isinstance(baseline.get("entries"), list):
        raise ReportError(f"--check: baseline format {baseline['pvf_report_baseline']!r} is not "
                          f"{FORMAT} (identities with device kind and batch size); write it again with "
                          "--save-baseline")
    current = {}
    for row in table.rows:
        for col in table.columns:
            e = row.entries.get(col.key)
            if e is not None:
                current[ident.key_of(e.identity)] = (row, col, e)
    bad: list[list[str]] = []
    missing: list[str] = []
    matched = set()
    for b in baseline["entries"]:
        bid = b.get("identity") or {}
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
            old, new = num(b.get(m)), getattr(e, m)
            if old is None:
                continue
            if new is None:
                bad.append([name, m, f"{old:.2f}", "missing", "", ""])
            elif new > old * (1 + cost_tol) + EPS * max(1.0, abs(old)):
                change = f"{(new / old - 1) * 100:+.1f}%" if old else f"{new:+.2f}"   # from 0: absolute
                bad.append([name, m, f"{old:.2f}", f"{new:.2f}", change, f"+{cost_tol * 100:g}%"])
        if check_speed:
            bad += _speed(name, b, row, col, speed_ref, speed_tol)
    notes = [f"not in the baseline: {describe(e.identity)}"
             for k, (_, _, e) in current.items() if k not in matched]
    return bad, missing, notes


def _acc(name: str, b: dict, e, acc_tol: float, z: float) -> list[list[str]]:
    old = num(b.get("acc"))
    if old is None:
        return []
    if e.acc is None:
        return [[name, "acc", f"{old:.2f}", "missing", "", ""]]
    drop = old - e.acc
    se_old, se_new = num(b.get("acc_se")), e.acc_se
    se = math.hypot(se_old or 0.0, se_new or 0.0)
    if drop > acc_tol and drop > z * se:
        allowed = f"-{acc_tol:g} pts and -{z:g} se ({z * se:.2f} pts)"
        return [[name, "acc", f"{old:.2f}", f"{e.acc:.2f}", f"{-drop:+.2f} pts", allowed]]
    return []


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
