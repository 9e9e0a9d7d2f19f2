"""``pvf-report``: a leaderboard of lm-eval runs with the paper's speedups, Pareto plots, and a
regression gate for CI.

    pvf-report OUT/ [OUT2/ ...] [--format text|markdown|csv] [--plot accuracy-nfe pareto.png]
               [--save-baseline FILE] [--check BASELINE.json]

Input: lm-eval ``--output_path`` folders (searched recursively for ``results_*.json``) or result
files. One row per run identity (model, decoder, every decoding parameter the decoder read, run
settings), one column group per task variant (task, version, few-shot count, generation length);
runs of the same row on different tasks share the row. Two runs of the same identity: the newest
is kept, and a note says so (``--save-baseline`` and ``--check`` refuse them instead).

Exit status: 0 done (the check passed), 1 the check failed (a regression, a baseline result
without a counterpart, another accuracy metric or sample count), 2 a usage error (an option out
of range, a path that is not there, two runs of one identity given to the gate, a baseline
result without an accuracy), 3 invalid input (a results file or baseline that cannot be read
or holds an impossible value, a result the baseline cannot check found in a folder, a baseline
whose accuracy check cannot fail without ``--allow-blind``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ...files import atomic
from ...decoding.registry import REFERENCE_DECODERS
from . import gate, plot as plotting
from .compare import Table, build_table
from .render import render
from ...files.reads import UnreadableFile, read_json
from .runs import MAX_RESULTS_BYTES, ReportError, UsageError, load

#: exit statuses (module docstring)
PASSED, REGRESSION, USAGE, INVALID_INPUT = 0, 1, 2, 3


def build(paths, metric_choice: dict | None = None, only_tasks=None) -> Table:
    """The table of every results file under ``paths``."""
    return build_table(load(paths, metric_choice), only_tasks)


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
        epilog="columns: n, acc (%) ± standard error, Δs change from static (points), NFE, TPF, "
               "TPS, ×s / ×t speedups over the static / threshold run of the same model and "
               "settings (NFE_ref/NFE, TPS/TPS_ref)")
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="lm_eval --output_path folders or results files")
    p.add_argument("--format", choices=["text", "markdown", "csv"], default="text")
    p.add_argument("-o", "--output", help="write the table to this file instead of stdout")
    p.add_argument("--tasks", help="comma-separated task columns (default: all)")
    p.add_argument("--metric", action="append", metavar="[TASK=]METRIC[,FILTER]",
                   help="accuracy metric, e.g. exact_match_flexible or gsm8k=exact_match,flexible-extract")
    p.add_argument("--plot", nargs=2, metavar=("KIND", "OUT"),
                   help=f"write a plot (matplotlib): KIND in {', '.join(plotting.PLOTS)}")
    p.add_argument("--log-x", action="store_true", help="--plot: logarithmic cost axis")
    p.add_argument("--save-baseline", metavar="FILE", help="write these results as a --check baseline")
    g = p.add_argument_group("regression gate (--check; exit 1 on a regression, 2 on a usage "
                             "error, 3 on an unreadable or impossible file, a result the "
                             "baseline cannot check, a baseline that cannot fail)")
    g.add_argument("--check", metavar="BASELINE.json", help="compare with this baseline")
    g.add_argument("--allow-missing", action="store_true",
                   help="pass although baseline results have no counterpart in these runs")
    g.add_argument("--allow-blind", action="store_true",
                   help="check although the accuracy of some baseline results cannot fail (the "
                        "drop allowed reaches the accuracy: too few items); said on stdout")
    g.add_argument("--acc-tol", type=float, default=1.0,
                   help="accuracy drop allowed, points (default 1.0); a drop fails only if it "
                        "also exceeds --z standard errors")
    g.add_argument("--z", type=float, default=2.0,
                   help="standard errors of the difference a drop must exceed (default 2)")
    g.add_argument("--cost-tol", type=float, default=0.0,
                   help="relative rise of NFE and branch rows allowed (default 0: none)")
    g.add_argument("--check-speed", action="store_true",
                   help="also check tokens/s, as the ratio to --speed-ref measured in the same runs")
    g.add_argument("--speed-ref", choices=list(REFERENCE_DECODERS), default="threshold",
                   help="reference decoder of --check-speed (default threshold)")
    g.add_argument("--speed-tol", type=float, default=0.10,
                   help="relative fall of the speed ratio allowed (default 0.10)")
    return p


def _note(msg: str) -> None:
    print(f"pvf-report: {msg}", file=sys.stderr)


def _read_baseline(path: str):
    if not Path(path).exists():
        raise UsageError(f"--check {path}: No such file or directory")
    try:        # a regular file of bounded size (a FIFO never blocks)
        return read_json(path, MAX_RESULTS_BYTES, "baseline")
    except UnreadableFile as exc:
        raise ReportError(f"--check {exc}") from None


def _write(what: str, path: str, text: str) -> None:
    try:
        atomic.write_text(path, text)
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        for name in ("acc_tol", "z", "cost_tol", "speed_tol"):
            value = getattr(args, name)
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"--{name.replace('_', '-')}={value} must be a finite number >= 0")
        if args.plot:
            plotting.check_kind(args.plot[0])
        baseline = _read_baseline(args.check) if args.check else None
        only = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
        table = build(args.paths, _metric_choice(args.metric), only)
        for n in table.notes:
            _note(f"note: {n}")
        base_text = None
        if args.save_baseline:      # refused before anything is written
            base_text = json.dumps(gate.baseline_dict(table), indent=1, ensure_ascii=True) + "\n"
        text = render(table, args.format)
        if args.output:
            _write("--output", args.output, text)
        else:
            sys.stdout.write(text)
        if args.plot:
            info = plotting.plot(table, args.plot[0], args.plot[1], log_x=args.log_x)
            _note(f"wrote {info.path}")
        if base_text is not None:
            _write("--save-baseline", args.save_baseline, base_text)
            _note(f"wrote baseline {args.save_baseline}")
        if baseline is not None:
            return _check(table, baseline, args)
    except ReportError as exc:
        _note(str(exc))
        return exc.exit_code
    return PASSED


def _check(table: Table, baseline: dict, args) -> int:
    bad, missing, notes = gate.check(
        table, baseline, acc_tol=args.acc_tol, z=args.z, cost_tol=args.cost_tol,
        check_speed=args.check_speed, speed_ref=args.speed_ref, speed_tol=args.speed_tol)
    for n in notes:
        _note(f"note: {n}")
    cannot_fail = gate.blind(gate.baseline_entries(baseline), args.acc_tol, args.z)
    if cannot_fail:
        what = "note" if args.allow_blind else "error"
        print(f"\npvf-report: {what}: the baseline cannot fail on the accuracy of "
              f"{len(cannot_fail)} result(s): the drop it allows reaches the accuracy, so that a "
              "result of 0 passes " + ("(--allow-blind):" if args.allow_blind else
                                       "(more items, a smaller --z or --acc-tol, or --allow-blind "
                                       "to accept it):"))
        print("\n".join(f"  {b}" for b in cannot_fail))
    failed = False
    if missing:
        what = "note" if args.allow_missing else "error"
        print(f"\npvf-report: {what}: {len(missing)} baseline result(s) not in these runs"
              + (" (--allow-missing)" if args.allow_missing else "") + ":")
        print("\n".join(f"  {m}" for m in missing))
        failed = not args.allow_missing
    if bad:
        print(f"\npvf-report: {len(bad)} regression(s) against {args.check}:")
        print(gate.table_text(["result", "metric", "baseline", "now", "change", "allowed"], bad))
        failed = True
    if cannot_fail and not args.allow_blind:
        return INVALID_INPUT        # a gate that cannot fail is no gate (docs/reports.md)
    if failed:
        return REGRESSION
    _note(f"check passed against {args.check}")
    return PASSED
