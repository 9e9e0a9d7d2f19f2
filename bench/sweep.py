"""Decoders x thresholds on a tiny fixture through the lm_eval CLI, then ``pvf-report``.

Every run is an ordinary ``lm_eval --model pvf-dlm ... --output_path OUT/runs/<run> --log_samples``
(executed in this process, one after the other, so the imports are paid once; ``--subprocess``
runs the ``lm_eval`` executable instead). ``static``, and ``freedave`` unless its model args say
``base_rule=threshold``, ignore the threshold and run once.
Afterwards: the leaderboard (printed and written to OUT/report.md, OUT/report.csv) and the
accuracy-NFE Pareto plot OUT/pareto_accuracy-nfe.png. Finished runs are reused unless --force.

    python bench/sweep.py                                   # tiny-llada, arith, --limit 200
    python bench/sweep.py --limit 20 --decoders threshold,pvf --thresholds 0.7,0.9 --out /tmp/sw
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchlib import PLANNING_DECODERS

REPO = Path(__file__).resolve().parents[1]


def run_name(decoder: str, threshold: float | None) -> str:
    return decoder if threshold is None else f"{decoder}_t{threshold:g}"


def plan(args) -> list[tuple[str, list[str]]]:
    """(run name, lm_eval argv) for every decoder x threshold."""
    runs = []
    for decoder in args.decoders:
        # static never reads the threshold, nor does freedave with its default static base rule
        reads_threshold = decoder != "static" and not (
            decoder == "freedave" and "base_rule=threshold" not in args.model_args)
        for thr in (args.thresholds if reads_threshold else [None]):
            model_args = [f"pretrained={args.model}", f"decoder={decoder}"]
            if thr is not None:
                model_args.append(f"threshold={thr:g}")
            if decoder in PLANNING_DECODERS and args.preset:
                model_args.append(f"preset={args.preset}")
            if args.gen_length:
                model_args.append(f"gen_length={args.gen_length}")
            if args.block_length:
                model_args.append(f"block_length={args.block_length}")
            model_args += args.model_args
            name = run_name(decoder, thr)
            argv = ["--model", "pvf-dlm", "--model_args", ",".join(model_args),
                    "--include_path", str(args.include_path), "--tasks", args.tasks,
                    "--limit", str(args.limit), "--output_path", str(args.out / "runs" / name),
                    "--log_samples"]
            if args.device:
                argv += ["--device", args.device]
            if args.batch_size:
                argv += ["--batch_size", str(args.batch_size)]
            runs.append((name, argv))
    return runs


def run_in_process(argv: list[str]) -> int:
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm_eval"] + argv
    try:
        cli_evaluate()
    except SystemExit as exc:  # the CLI may exit on errors
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # noqa: BLE001  (e.g. an invalid decoder setting: next run)
        print(f"sweep: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llada", help="pretrained= value (default tiny-llada)")
    p.add_argument("--tasks", default="arith")
    p.add_argument("--include_path", type=Path, default=REPO / "tasks")
    p.add_argument("--decoders", default="static,threshold,freedave,pvf",
                   type=lambda s: [d.strip() for d in s.split(",") if d.strip()])
    # pvf's math-word planning band ends at 0.65: thresholds below it are invalid for pvf
    p.add_argument("--thresholds", default="0.7,0.8,0.9,0.95",
                   type=lambda s: [float(t) for t in s.split(",") if t.strip()])
    p.add_argument("--limit", type=int, default=200, help="items per run (default 200)")
    p.add_argument("--preset", default="arith", help="preset= for pvf/explore runs ('' for none)")
    p.add_argument("--gen-length", type=int, help="gen_length= (default: the task's max_gen_toks)")
    p.add_argument("--block-length", type=int)
    p.add_argument("--model-args", default="", type=lambda s: [a for a in s.split(",") if a],
                   help="extra comma-separated model args for every run")
    p.add_argument("--batch-size", type=int, default=16,
                   help="lm_eval --batch_size (requests decoded together; outputs do not depend on it)")
    p.add_argument("--device", help="--device for lm_eval (default: lm_eval's, CPU without CUDA)")
    p.add_argument("--threads", type=int, help="torch CPU threads (in-process runs; 1 suits the tiny "
                   "fixtures on a shared machine)")
    p.add_argument("--out", type=Path, default=REPO / "out" / "sweep", help="default: out/sweep")
    p.add_argument("--force", action="store_true", help="rerun runs that already have results")
    p.add_argument("--subprocess", action="store_true", help="run the lm_eval executable per run")
    p.add_argument("--dry-run", action="store_true", help="print the lm_eval commands only")
    args = p.parse_args(argv)

    runs = plan(args)
    if args.threads and not args.dry_run:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # for --subprocess runs
        import torch

        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    failed = []
    for i, (name, run_argv) in enumerate(runs, 1):
        out_dir = args.out / "runs" / name
        cmd = "lm_eval " + " ".join(shlex.quote(a) for a in run_argv)
        if args.dry_run:
            print(cmd)
            continue
        if not args.force and any(out_dir.rglob("results_*.json")):
            print(f"[{i}/{len(runs)}] {name}: reusing {out_dir}", file=sys.stderr)
            continue
        print(f"[{i}/{len(runs)}] {name}: {cmd}", file=sys.stderr)
        t0 = time.time()
        if args.subprocess:
            rc = subprocess.call(["lm_eval"] + run_argv)
        else:
            rc = run_in_process(run_argv)
        print(f"[{i}/{len(runs)}] {name}: rc={rc} in {time.time() - t0:.0f}s", file=sys.stderr)
        if rc:
            failed.append(name)
    if args.dry_run:
        return 0

    from benchlib import report

    base = [str(args.out / "runs")]
    rc = report.main(base)
    report.main(base + ["--format", "markdown", "-o", str(args.out / "report.md")])
    report.main(base + ["--format", "csv", "-o", str(args.out / "report.csv")])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("sweep: matplotlib missing (pip install 'pvf-lmeval[plot]'): no plot", file=sys.stderr)
    else:
        from benchlib import plot

        table = report.build(base)
        for kind in ("accuracy-nfe", "accuracy-tps"):
            info = plot(table, kind, str(args.out / f"pareto_{kind}.png"), log_x=True)
            print(f"sweep: wrote {info.path}", file=sys.stderr)
    print(f"sweep: wrote {args.out / 'report.md'} and {args.out / 'report.csv'}", file=sys.stderr)
    if failed:
        print(f"sweep: failed runs: {', '.join(failed)}", file=sys.stderr)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
