"""fnlcore's layers: no import cycle between modules, no two-way dependency between parts,
and an engine (fnlcore.fl) that knows no method, no application code and no dataset name.

Imports are read from the source with ``ast`` at any depth (inside functions too), so a
late import cannot hide a back edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "fnlcore"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """fnlcore modules imported by module ``name`` (``from . import x`` counts x when x is a module)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "fnlcore")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "fnlcore":
                continue
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            out.update(subs if subs and len(subs) == len(node.names) else [mod, *subs])
    return {m for m in out if m in known and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a path, or None (iterative DFS)."""
    state: dict[str, int] = {}
    for root in sorted(graph):
        if state.get(root):
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
                path.append(nxt)
    return None


def test_no_import_cycle_between_modules(graph):
    # a package's __init__ re-exporting its own modules is not a cycle of the code's layers
    edges = {m: {d for d in ds if not (m.startswith(d + ".") and _modules()[d].name == "__init__.py")} for m, ds in graph.items()}
    cyc = _cycle(edges)
    assert cyc is None, "import cycle: " + " -> ".join(cyc)


def test_no_two_way_dependency_between_parts(graph):
    parts: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for m, deps in graph.items():
        for d in deps:
            a, b = _part(m), _part(d)
            if a != b:
                parts.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{m} imports {d}")
    both = sorted({tuple(sorted((a, b))) for a, bs in parts.items() for b in bs if a in parts.get(b, ())})
    assert not both, "two-way dependencies: " + "; ".join(f"{why[(a, b)]} and {why[(b, a)]}" for a, b in both)


def test_the_engine_knows_no_method_no_application_and_no_dataset_name(graph):
    from fnlcore.datasets import DATASETS

    bad = {m: sorted(d for d in deps if _part(d) in ("fnlcore.methods", "fnlcore.app", "fnlcore.datasets"))
           for m, deps in graph.items() if _part(m) == "fnlcore.fl"}
    assert not any(bad.values()), bad
    names = set(DATASETS)
    for path in (PKG / "fl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, f"{path.name} names dataset {node.value!r}"


def test_the_checker_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .fl import local\n    import fnlcore.noise\n")
    known = {"fnlcore.fl", "fnlcore.fl.local", "fnlcore.noise", "fnlcore.x"}
    assert _imports("fnlcore.x", src, known) == {"fnlcore.fl.local", "fnlcore.noise"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
