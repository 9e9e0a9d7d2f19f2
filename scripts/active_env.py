"""Which python ``make demo`` / ``make test`` run: the active environment's or the checkout's .venv.

The Makefile runs this with the python on PATH (``$(PYTHON)``, ``python3`` by default: the one an
activated venv or conda environment puts first) and reads one word from stdout:

- that python's path: its environment has this checkout's package installed editable
  (``pip install -e .``, with the ``.pth`` hook of the current install inputs) and every
  requirement the goals need (the package's own; ``make test`` also its ``test`` and ``plot``
  extras, what ``make venv`` installs). One line on stderr says so.
- nothing: use (and build if needed) the .venv. Silent when that environment has no pvf-lmeval
  at all or is the .venv itself; one line on stderr when it has another copy (another checkout,
  a non-editable install).
- ``missing``: it has this checkout's package but not everything the goals need, or an install
  older than the install inputs. One line on stderr names what is missing and how to get it.

Standard library (and ``packaging``, which every environment with the package has through
transformers, else pip's copy) only: it runs before any .venv exists.

    python3 scripts/active_env.py --venv .venv --goals demo test --inputs pyproject.toml ...
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

DIST = "pvf-lmeval"
#: the extras each goal needs beyond the package's own requirements (make venv installs both)
GOAL_EXTRAS = {"demo": (), "test": ("test", "plot")}


def _requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def editable_source(dist) -> Path | None:
    """The folder ``dist`` is installed editable from (its ``direct_url.json``), else None."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    url = urlparse(info.get("url", ""))
    if not info.get("dir_info", {}).get("editable") or url.scheme != "file":
        return None
    return Path(unquote(url.path))


def unmet(dist, extras) -> list[str]:
    """``dist``'s requirements for ``extras`` (and its own) that this environment lacks, each as
    ``name (not installed)`` or ``name VERSION (needs SPEC)``."""
    requirement = _requirement_class()
    missing = []
    for line in dist.requires or []:
        req = requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e})
                                              for e in ("", *extras)):
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            missing.append(f"{req.name} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(f"{req.name} {version} (needs {req.specifier})")
    return sorted(set(missing))


def same(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def choose(checkout: Path, venv: Path, goals: list[str], inputs: list[str]) -> tuple[str, str]:
    """(the word for the Makefile, the line for stderr or "")."""
    here = sys.executable
    if same(sys.prefix, venv):
        return "", ""
    try:
        dist = md.distribution(DIST)
    except md.PackageNotFoundError:
        return "", ""
    source = editable_source(dist)
    spec = importlib.util.find_spec("pvf_lmeval")
    package = Path(spec.origin).parent if spec and spec.origin else None
    if source is None or not same(source, checkout):
        what = (f"an editable install of {source}" if source is not None
                else f"a non-editable install ({package or 'not importable'})")
    elif package is None or not same(package, checkout / "pvf_lmeval"):
        what = f"this checkout's editable install, but imports pvf_lmeval from {package}"
    else:
        what = ""
    if what:
        return "", (f"pvf-lmeval: {here} has {DIST} {dist.version} as {what}; using {venv} "
                    "(pip install -e . in this checkout to use that environment instead)")
    extras = list(dict.fromkeys(e for g in goals for e in GOAL_EXTRAS[g]))
    fix = f"pip install -e \".[{','.join(extras)}]\"" if extras else "pip install -e ."
    hook = importlib.util.find_spec("pvf_lmeval_hook")
    if hook is None or not hook.origin:
        need = "its .pth hook, pvf_lmeval_hook (missing)"
    else:
        installed = os.path.getmtime(hook.origin)
        newer = [f for f in inputs if os.path.getmtime(checkout / f) > installed]
        need = f"a fresh install ({', '.join(newer)} changed since)" if newer else ""
    need = need or ", ".join(unmet(dist, extras))
    if need:
        goal = " and ".join(f"make {g}" for g in goals) + (" needs" if len(goals) == 1 else " need")
        return "missing", (f"pvf-lmeval: {here} has this checkout's {DIST}, but {goal} "
                           f"{need}: run {fix} there, or USE_VENV=1 to use {venv}")
    with_extras = f", with its {' and '.join(extras)} extras" if extras else ""
    return sys.executable, (f"pvf-lmeval: using the active environment, {sys.prefix} (this "
                            f"checkout's editable install{with_extras}), not {venv}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", required=True, type=Path,
                        help="the checkout's venv folder, as the Makefile names it (relative to "
                             "the current folder)")
    parser.add_argument("--goals", nargs="+", required=True, choices=sorted(GOAL_EXTRAS))
    parser.add_argument("--inputs", nargs="*", default=[],
                        help="install inputs, relative to the checkout: newer ones than the "
                             "install mean it must be redone")
    args = parser.parse_args(argv)
    checkout = Path(__file__).resolve().parents[1]
    word, line = choose(checkout, args.venv, args.goals, args.inputs)
    if line:
        print(line, file=sys.stderr)
    print(word)
    return 0


if __name__ == "__main__":
    sys.exit(main())
