"""fnlcore's layers: no import cycle between modules, no two-way dependency between parts,
and an engine (fnlcore.fl) that knows no method, no application code and no dataset name.

Imports are read from the source with ``ast`` at any depth (inside functions too), so a
late import cannot hide a back edge.
"""

from __future__ import annotations

import ast
import re
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


def _two_way(graph: dict[str, set[str]]) -> list[str]:
    """Each pair of parts that import each other, with one import that makes each direction."""
    parts: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for m in sorted(graph):
        for d in sorted(graph[m]):
            a, b = _part(m), _part(d)
            if a != b:
                parts.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{m} imports {d}")
    both = sorted({tuple(sorted((a, b))) for a, bs in parts.items() for b in bs if a in parts.get(b, ())})
    return [f"{why[(a, b)]} and {why[(b, a)]}" for a, b in both]


# What the engine must not import: methods sit on it, the application drives it, and
# datasets reach it only as arrays (FederatedData) that the application builds.
ENGINE_MUST_NOT_IMPORT = ("fnlcore.methods", "fnlcore.app", "fnlcore.datasets")


def _engine_imports_above_it(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    bad = {m: sorted(d for d in deps if _part(d) in ENGINE_MUST_NOT_IMPORT)
           for m, deps in graph.items() if _part(m) == "fnlcore.fl"}
    return {m: ds for m, ds in bad.items() if ds}


def _names_in(path: Path, names: set[str]) -> list[str]:
    """String literals of ``path`` (f-string pieces included) that are one of ``names``."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names})


def test_no_import_cycle_between_modules(graph):
    cyc = _cycle(graph)
    assert cyc is None, "import cycle: " + " -> ".join(cyc)


def test_no_two_way_dependency_between_parts(graph):
    both = _two_way(graph)
    assert not both, "two-way dependencies: " + "; ".join(both)


def test_the_engine_knows_no_method_no_application_and_no_dataset_name(graph):
    from fnlcore.datasets import DATASETS

    bad = _engine_imports_above_it(graph)
    assert not bad, "the engine imports above itself: " + "; ".join(f"{m} imports {', '.join(ds)}" for m, ds in bad.items())
    names = set(DATASETS)
    assert names, "no dataset registered: the name check below would check nothing"
    named = {p.name: _names_in(p, names) for p in sorted((PKG / "fl").rglob("*.py"))}
    assert not any(named.values()), "the engine names datasets: " + "; ".join(f"fl/{k}: {', '.join(v)}" for k, v in named.items() if v)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .fl import local\n    import fnlcore.noise\n")
    known = {"fnlcore.fl", "fnlcore.fl.local", "fnlcore.noise", "fnlcore.x"}
    assert _imports("fnlcore.x", src, known) == {"fnlcore.fl.local", "fnlcore.noise"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_checker_finds_two_way_parts_and_engine_back_edges(tmp_path):
    graph = {
        "fnlcore.fl.local": {"fnlcore.errors"},
        "fnlcore.fl.simulation": {"fnlcore.app.train"},  # e.g. a late import inside a function
        "fnlcore.app.train": {"fnlcore.fl.local"},
        "fnlcore.errors": set(),
    }
    assert _cycle(graph) is None  # module level: no cycle ...
    assert _two_way(graph) == ["fnlcore.app.train imports fnlcore.fl.local and fnlcore.fl.simulation imports fnlcore.app.train"]
    assert _engine_imports_above_it(graph) == {"fnlcore.fl.simulation": ["fnlcore.app.train"]}
    src = tmp_path / "settings.py"
    src.write_text("def aug(name):\n    return 'crop_flip' if name == 'cifar10' else f'{name}-mnist'\n")
    assert _names_in(src, {"cifar10", "mnist", "isic2019"}) == ["cifar10"]


def test_every_folder_of_modules_is_a_package_that_an_install_ships():
    # pyproject.toml's packages.find skips a folder without __init__.py (a namespace
    # package): its modules import from a checkout but are missing from a built wheel.
    folders = {p.parent for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    bare = sorted(str(f.relative_to(PKG.parent)) for f in folders if not (f / "__init__.py").is_file())
    assert not bare, f"folders without __init__.py (left out of an install): {bare}"


# The methods' one door into the engine: fnlcore.methods.api (base, the registry's glue and the cost
# stages it re-exports sit beside it). A method module importing fnlcore.fl.* directly is a leak.
ENGINE_PARTS = ("fnlcore.fl", "fnlcore.errors", "fnlcore.registry", "fnlcore.syncs", "fnlcore.spec")
METHODS_DOOR = {"fnlcore.methods", "fnlcore.methods.api", "fnlcore.methods.base", "fnlcore.methods.schedule"}


def test_methods_reach_the_engine_only_through_the_api_module(graph):
    leaks = {m: sorted(d for d in deps if _part(d) in ENGINE_PARTS)
             for m, deps in graph.items() if _part(m) == "fnlcore.methods" and m not in METHODS_DOOR}
    leaks = {m: ds for m, ds in leaks.items() if ds}
    assert graph["fnlcore.methods.gce"] >= {"fnlcore.methods.api"}  # the checker sees a method's imports
    assert not leaks, "import these from fnlcore.methods.api: " + "; ".join(f"{m}: {', '.join(ds)}" for m, ds in leaks.items())


# The method contract is one module a method author reads alone; the engines run it. The contract
# imports no engine (at any depth), and the engine loops live in their own modules.
CONTRACT = "fnlcore.fl.contract"
ENGINES = ("fnlcore.fl.batched", "fnlcore.fl.sequential", "fnlcore.fl.stacked",
           "fnlcore.fl.simulation")


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for d in graph.get(todo.pop(), ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_the_contract_imports_no_engine(graph):
    assert graph[CONTRACT], "the checker sees no import of the contract module: the check below would check nothing"
    reached = _reached(graph, CONTRACT)
    assert not reached & set(ENGINES), f"{CONTRACT} reaches engine modules: {sorted(reached & set(ENGINES))}"
    # no RunContext: nothing in the contract can run a client's training
    assert "fnlcore.fl.context" not in reached, f"{CONTRACT} reaches fnlcore.fl.context (a RunContext: the engine's)"
    tree = ast.parse((PKG / "fl" / "contract.py").read_text())
    takes_ctx = sorted(f.name for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs
                       if a.arg == "ctx" or (a.annotation is not None and "RunContext" in ast.unparse(a.annotation)))
    assert not takes_ctx, f"{CONTRACT} defines functions that take a run context (engine work): {takes_ctx}"


def test_the_contract_types_and_reducers_are_defined_in_the_contract_module():
    import fnlcore.fl.contract as contract

    names = set(contract.__all__)
    assert {"Stage", "Phase", "LocalJob", "Batch", "StackedBatch", "ClientUpdate", "masked_mean",
            "clients_cross_entropy", "clients_mean"} <= names
    elsewhere = {n: getattr(contract, n).__module__ for n in sorted(names | {"OneForm"})
                 if getattr(contract, n).__module__ != CONTRACT}
    assert not elsewhere, f"re-exported, not defined, by {CONTRACT}: {elsewhere}"


def test_the_sequential_engine_is_one_module_and_no_client_module_holds_one(graph):
    from fnlcore.fl import sequential

    loops = ("run_phase", "train_client", "train_epochs", "train_streams")
    assert all(getattr(sequential, f).__module__ == "fnlcore.fl.sequential" for f in loops)
    defined = {p.name: sorted(f.name for f in ast.walk(ast.parse(p.read_text())) if isinstance(f, ast.FunctionDef)
                              and f.name in loops)
               for p in sorted(PKG.rglob("*.py")) if p != PKG / "fl" / "sequential.py"}
    assert not any(defined.values()), "engine loops defined outside fnlcore.fl.sequential: " + "; ".join(
        f"{k}: {', '.join(v)}" for k, v in defined.items() if v)
    assert "fnlcore.fl.client" not in graph, "fnlcore/fl/client.py is back: the contract is fl.contract, the loop fl.sequential"


def test_the_methods_door_offers_the_whole_contract_and_no_engine_loop(graph):
    import fnlcore.fl.contract as contract
    import fnlcore.methods.api as api

    missing = sorted(n for n in contract.__all__ if getattr(api, n, None) is not getattr(contract, n))
    assert not missing, f"fnlcore.methods.api lacks these contract names (or offers other objects): {missing}"
    assert set(contract.__all__) <= set(api.__all__)
    loops = {m: sorted(d for d in graph[m] if d in ENGINES) for m in sorted(METHODS_DOOR)}
    assert not any(loops.values()), "the methods' door imports an engine loop (a method declares, the engine runs): " + \
        "; ".join(f"{m}: {', '.join(ds)}" for m, ds in loops.items() if ds)


# One file per method that does not leak: a method module (one that defines an entry of METHODS)
# imports no other method module; what two methods share lives in a shared module that registers
# nothing (robust_aggregation, small_loss, self_regularisation, ...).


def _method_modules() -> set[str]:
    from fnlcore.methods import METHODS

    # reading METHODS imports every module first; plug-ins from outside the package (FNL_PLUGINS) are not its files
    return {cls.__module__ for cls in METHODS.values() if cls.__module__.startswith("fnlcore.")}


def _method_leaks(graph: dict[str, set[str]], method_modules: set[str]) -> list[str]:
    return [f"{m} imports {d}: move what they share into a shared module of fnlcore/methods "
            f"(one that registers no method) and import it from both"
            for m in sorted(method_modules) for d in sorted(graph.get(m, ())) if d in method_modules]


def test_no_method_module_imports_another(graph):
    method_modules = _method_modules()
    assert {"fnlcore.methods.krum", "fnlcore.methods.fedlsr"} <= method_modules  # the registry was read
    assert "fnlcore.methods.parts" not in method_modules and "fnlcore.methods.api" not in method_modules
    missing = sorted(method_modules - set(graph))
    assert not missing, f"method modules the import graph does not see: {missing}"
    leaks = _method_leaks(graph, method_modules)
    assert not leaks, "; ".join(leaks)


def test_the_checker_finds_a_method_importing_another(tmp_path):
    src = tmp_path / "a.py"
    src.write_text("from .krum import float_keys\nimport fnlcore.methods.median\nfrom . import parts\n")
    known = {"fnlcore.methods", "fnlcore.methods.krum", "fnlcore.methods.median", "fnlcore.methods.parts"}
    graph = {"fnlcore.methods.a": _imports("fnlcore.methods.a", src, known)}
    assert graph["fnlcore.methods.a"] == {"fnlcore.methods.krum", "fnlcore.methods.median", "fnlcore.methods.parts"}
    leaks = _method_leaks(graph, {"fnlcore.methods.a", "fnlcore.methods.krum", "fnlcore.methods.median"})
    assert [leak.split(":")[0] for leak in leaks] == ["fnlcore.methods.a imports fnlcore.methods.krum",
                                                      "fnlcore.methods.a imports fnlcore.methods.median"]


# The one store of step costs and rehearsal tables (fnlcore/app/measurements.py): only it names their files,
# so only it can open, parse or write one, and its precedence rule is the only one. A file's name alone
# (a literal that is a path or file name, no spaces) counts; prose that mentions a file does not.
MEASUREMENT_STORE = "fnlcore.app.measurements"
MEASUREMENT_FILE = re.compile(r"[\w./*{}-]*(step_costs[\w*]*\.json|rehearsal[\w*]*\.csv)")


def _measurement_file_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return sorted({n.value for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str) and MEASUREMENT_FILE.fullmatch(n.value)})


def _only(owner: str, modules: dict[str, Path], find, fix: str) -> None:
    """``find(path)`` lists what only module ``owner`` may do: fail naming every other module that does it."""
    assert find(modules[owner]), f"{owner} itself does none of it: the check checks nothing"
    found = {m: f for m, p in sorted(modules.items()) if m != owner and (f := find(p))}
    assert not found, fix + ": " + "; ".join(f"{m}: {', '.join(f)}" for m, f in found.items())


def test_only_the_measurement_store_names_a_step_cost_or_rehearsal_file():
    _only(MEASUREMENT_STORE, _modules(), _measurement_file_names, "read and write these through fnlcore.app.measurements")


def test_the_measurement_file_check_sees_names_and_paths_but_not_prose(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('P = Path(d) / "step_costs.json"\nQ = f"{out}/rehearsal.csv"\nG = "rehearsal_*.csv"\n'
                   'HELP = "the step costs (default: RESULTS/plan/step_costs.json)"\nT = "step_costs.csv"\n')
    assert _measurement_file_names(src) == ["/rehearsal.csv", "rehearsal_*.csv", "step_costs.json"]


# A run's files in one room: within the engine only fnlcore.fl.persist writes or reads a file (the run's
# checkpoint, its per-client stores), so how a checkpoint is saved, checked and resumed is one module's.
ENGINE_FILE_STORE = "fnlcore.fl.persist"
FILE_FUNCTIONS = {"atomic_path", "ensure_free_space", "load_safely", "open"}  # called by name
FILE_MODULE_CALLS = {"torch": {"save", "load"}, "os": {"remove", "rename", "replace", "unlink"},
                     "shutil": {"rmtree", "move", "copy", "copyfile"}, "np": {"save", "load"}}
PATH_METHODS = {"unlink", "write_bytes", "write_text", "read_bytes", "read_text"}  # on any path


def _file_calls(path: Path) -> list[str]:
    """Calls in ``path`` that touch a file: ``torch.save``, ``os.remove``, ``atomic_path(...)``, ``p.unlink()``..."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        f = n.func if isinstance(n, ast.Call) else None
        if isinstance(f, ast.Name) and f.id in FILE_FUNCTIONS:
            out.add(f.id)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr in FILE_MODULE_CALLS.get(f.value.id, ()):
            out.add(f"{f.value.id}.{f.attr}")
        elif isinstance(f, ast.Attribute) and f.attr in PATH_METHODS:
            out.add(f.attr)
    return sorted(out)


def test_only_persist_touches_files_in_the_engine():
    engine = {m: p for m, p in _modules().items() if _part(m) == "fnlcore.fl"}
    _only(ENGINE_FILE_STORE, engine, _file_calls, "read and write a run's files through fnlcore.fl.persist")


def test_the_file_check_sees_saves_removals_and_atomic_writes(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("torch.save(x, p)\nos.remove(p)\nwith atomic_path(p) as t:\n    pass\np.unlink()\n"
                   "self.stores.save(1)\nx.load(s)\nstate.update(a)\n")
    assert _file_calls(src) == ["atomic_path", "os.remove", "torch.save", "unlink"]


# Datasets are read and written below the engine: nothing of fnlcore.datasets imports fnlcore.fl
# (how files become images, fnlcore.image_transforms, sits below both).


def test_datasets_import_nothing_of_the_engine(graph):
    assert graph["fnlcore.datasets.decoded_cache"], "the checker sees no import of the decoded cache"
    bad = {m: sorted(d for d in deps if _part(d) == "fnlcore.fl")
           for m, deps in graph.items() if _part(m) == "fnlcore.datasets"}
    bad = {m: ds for m, ds in bad.items() if ds}
    assert not bad, ("fnlcore.datasets imports the engine (move what it needs below both, as fnlcore.image_transforms): "
                     + "; ".join(f"{m} imports {', '.join(ds)}" for m, ds in bad.items()))


# A module's dependencies stand at its top. An import inside a function hides one, so each says why
# it is there with a `# lazy: <why>` comment on its line or the line above: an import cycle, or a heavy
# or optional package (torch, Snakemake, jsonschema, matplotlib, scikit-learn) that the module must
# import without.
LAZY_MARK = "# lazy:"


def _unmarked_lazy_imports(path: Path) -> list[int]:
    """Lines of ``path`` with an import inside a function and no ``# lazy:`` comment on it or above it."""
    lines = path.read_text().splitlines()
    found: set[int] = set()
    for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not any(
                        LAZY_MARK in lines[i] for i in range(max(0, node.lineno - 2), node.end_lineno)):
                    found.add(node.lineno)
    return sorted(found)


def test_every_import_inside_a_function_says_why():
    unmarked = {str(p.relative_to(PKG)): _unmarked_lazy_imports(p) for p in sorted(PKG.rglob("*.py"))}
    hidden = [f"fnlcore/{f}:{ln}" for f, lns in unmarked.items() for ln in lns]
    assert not hidden, (
        "imports inside functions hide a dependency: move each to the module's top, or, where an import "
        "cycle or a heavy optional package forces it, add `# lazy: <why>` on its line or the line above: "
        + ", ".join(hidden))


def test_the_lazy_import_check_sees_unmarked_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n\n\ndef f():\n    import json\n    # lazy: torch is optional here\n    import torch\n"
                   "    from .x import (\n        y,\n    )  # lazy: a cycle with .x\n\n\ndef g():\n    def h():\n"
                   "        from . import z\n    import re  # lazy: why\n")
    assert _unmarked_lazy_imports(src) == [5, 15]
