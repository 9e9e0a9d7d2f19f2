"""``pvf-tasks-path``: print the folder of the task YAMLs (for ``--include_path``)."""

from __future__ import annotations

import sys

from ..files.paths import tasks_dir


def main(argv: list[str] | None = None) -> int:
    """Console script ``pvf-tasks-path``: print the installed tasks folder."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print("usage: pvf-tasks-path\n\nPrint the folder of pvf-lmeval's task YAMLs, e.g.\n"
              '  lm_eval --include_path "$(pvf-tasks-path)" --tasks arith ...')
        return 0
    try:
        print(tasks_dir())
    except FileNotFoundError as exc:
        print(f"pvf-tasks-path: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
