"""The package's layers as docs/design.md writes them, read from the source (every import
statement, those inside functions included): no import circle between modules, the cores
independent of each other and of the face, and the benchmark scripts reaching the package only
through ``bench/benchlib.py``."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pvf_lmeval"


def _modules(root: Path, prefix: str) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [prefix, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported(node, module: str, is_package: bool, known) -> set[str]:
    """The modules of ``known`` an import statement of ``module`` names: ``from p import m``
    names the module p.m when there is one, else p (whose ``__init__`` runs)."""
    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = module.split(".") if is_package else module.split(".")[:-1]
        if node.level:
            base = base[:len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix
                 for a in node.names]
    return {m for m in map(owner, names) if m is not None}


def import_graph(root: Path = PACKAGE, prefix: str = "pvf_lmeval") -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its body)."""
    known = _modules(root, prefix)
    graph = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _imported(node, module, path.name == "__init__.py", known)
        graph[module] = deps - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """A circle made of a relative import, an absolute one inside a function and ``from . import
    module`` is found; ``from package import name`` depends on the package's ``__init__``."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    import p.b\n")
    (pkg / "b.py").write_text("from .sub import c\n")
    (pkg / "sub" / "c.py").write_text("from . import a\n")
    graph = import_graph(pkg, "p")
    assert graph["p.b"] == {"p.sub.c"} and graph["p.sub.c"] == {"p.sub.a"}
    assert graph["p.sub.a"] == {"p.b"} and graph["p.sub"] == {"p.sub.a"}
    assert circles(graph) == [["p.b", "p.sub.a", "p.sub.c"]]
    (pkg / "sub" / "a.py").write_text("def f():\n    pass\n")
    assert circles(import_graph(pkg, "p")) == []


@functools.lru_cache(maxsize=1)
def package_graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_circle_in_the_package():
    assert circles(package_graph()) == []


def _reaches(graph, source: str, target: str) -> list[str]:
    """The modules of ``source`` that import a module of ``target`` (packages by prefix)."""
    return sorted(m for m, deps in graph.items() if m.startswith(source + ".") or m == source
                  for d in deps if d == target or d.startswith(target + "."))


@pytest.mark.parametrize("source, target", [
    ("pvf_lmeval.decoding", "pvf_lmeval.models"),     # two cores, one face
    ("pvf_lmeval.models", "pvf_lmeval.decoding"),
    ("pvf_lmeval.models", "pvf_lmeval.lmeval"),
    ("pvf_lmeval.decoding", "pvf_lmeval.lmeval"),
    ("pvf_lmeval.lmeval", "pvf_lmeval.cli"),          # console tools stand beside
    ("pvf_lmeval.decoding", "pvf_lmeval.cli"),
    ("pvf_lmeval.models", "pvf_lmeval.cli"),
    ("pvf_lmeval.planning", "pvf_lmeval.cli"),
    ("pvf_lmeval.data", "pvf_lmeval.lmeval"),         # a library the task utilities call
])
def test_a_layer_does_not_import_another(source, target):
    assert _reaches(package_graph(), source, target) == []


def test_bench_scripts_reach_the_package_through_benchlib():
    reach = {}
    for path in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "pvf_lmeval" or n.startswith("pvf_lmeval.") for n in names):
                reach.setdefault(path.name, []).append(node.lineno)
    assert list(reach) == ["benchlib.py"], reach
