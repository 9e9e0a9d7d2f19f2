"""Wall time to check HumanEval's 164 canonical solutions (and 164 `pass` bodies) with the
sandbox, against the in-process audit-hook runner this project used before (its
``code_exec.py`` read from git at ``--baseline-rev``), in the same process, one after the
other, on the same pool size.

    python bench/humaneval_exec_time.py [--data FILE] [--workers N] [--baseline-rev REV]

Prints one line per (runner, solutions): passed/164 and seconds. The data is the file of
``pvf-data fetch --only humaneval`` (default: the user's data dir).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
import types

from benchlib import check_candidates, default_workers, REPO


def _problems(path: str | None) -> list[dict]:
    if path is None:
        from benchlib import dataset_file
        path = dataset_file("humaneval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _baseline(rev: str):
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:pvf_lmeval/code_exec.py"],
                         check=True, capture_output=True, text=True).stdout
    mod = types.ModuleType("code_exec_baseline")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, f"{rev}:code_exec.py", "exec"), mod.__dict__)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="HumanEval.jsonl.gz (default: pvf-data's copy)")
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--baseline-rev", default="d969c4d",
                    help="git revision whose pvf_lmeval/code_exec.py is the old runner "
                         "('' to skip it)")
    args = ap.parse_args(argv)
    probs = _problems(args.data)
    sets = {"canonical": [p["canonical_solution"] for p in probs],
            "pass-body": ["    pass\n" for _ in probs]}
    for name, bodies in sets.items():
        if args.baseline_rev:
            old = _baseline(args.baseline_rev)
            progs = [p["prompt"] + b + "\n" + p["test"] + f"\ncheck({p['entry_point']})"
                     for p, b in zip(probs, bodies)]
            t0 = time.monotonic()
            res = old.run_programs(progs, workers=args.workers)
            dt = time.monotonic() - t0
            print(f"audit-hook runner ({args.baseline_rev})  {name:9s}  "
                  f"passed {sum(r.passed for r in res)}/{len(res)}  {dt:6.1f} s")
        jobs = [dict(program=p["prompt"] + b, prompt=p["prompt"], test=p["test"],
                     entry_point=p["entry_point"]) for p, b in zip(probs, bodies)]
        t0 = time.monotonic()
        res = check_candidates(jobs, workers=args.workers)
        dt = time.monotonic() - t0
        print(f"sandbox (bwrap, 2 processes)  {name:9s}  "
              f"passed {sum(r.passed for r in res)}/{len(res)}  {dt:6.1f} s  "
              f"reasons {sorted({r.reason for r in res})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
