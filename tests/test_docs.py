"""README is short and points at docs/; the reference tables in docs/ are generated from the
registries and must be current; every name and link the documentation gives exists."""

import importlib
import re

import pytest

from fnlcore import docs

README_MAX_LINES = 350


def _documentation(repo_root):
    """README.md and every page of docs/, as (path relative to the root, text)."""
    pages = [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]
    return [(str(p.relative_to(repo_root)), p.read_text()) for p in pages]


def test_generated_sections_are_current(repo_root):
    assert docs.stale_pages(repo_root) == [], "docs/ is stale: run `python -m fnlcore.docs`"


def test_every_generated_section_is_on_its_page(repo_root):
    """A section moved to another page without moving its entry in fnlcore.docs.PAGES is an error."""
    for page, names in docs.PAGES.items():
        text = (repo_root / page).read_text()
        assert [n for n in names if f"<!-- BEGIN generated:{n} -->" not in text] == [], page
    assert sorted(n for names in docs.PAGES.values() for n in names) == sorted(docs.sections())


def test_a_page_without_its_markers_is_named_with_the_fix():
    with pytest.raises(SystemExit, match=r"docs/x\.md has no generated section 'methods': add the BEGIN/END"):
        docs.render("no markers here\n", ("methods",), "docs/x.md")


def test_readme_starts_with_the_two_setup_commands(repo_root):
    text = (repo_root / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert "snakemake --cores" in block[0] and "pytest" in block[1]
    ci = (repo_root / ".ci" / "run").read_text()
    assert block[1].split("#")[0].strip() in ci  # CI runs the very test command README gives
    assert all(line.startswith("bash scripts/setup.sh && ") for line in block)


def test_readme_is_a_ten_minute_read(repo_root):
    lines = (repo_root / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES}: move reference text to a page "
        "of docs/ and link it from README")


def test_every_docs_link_resolves_and_every_page_is_reachable(repo_root):
    """README's links to docs/*.md name files that exist, and every page of docs/ is linked from
    README (directly, or from a page README links): nothing moved out of README is lost."""
    readme = (repo_root / "README.md").read_text()
    linked = re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", readme)
    assert linked, "README links no page of docs/"
    assert [p for p in linked if not (repo_root / p).is_file()] == []
    reachable, todo = set(), list(dict.fromkeys(linked))
    while todo:
        page = todo.pop()
        if page in reachable:
            continue
        reachable.add(page)
        text = (repo_root / page).read_text()
        for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[^)]*)?\)", text):
            path = f"docs/{target}" if "/" not in target else target
            if path.startswith("docs/"):
                assert (repo_root / path).is_file(), f"{page} links {target}, which does not exist"
                todo.append(path)
    pages = {str(p.relative_to(repo_root)) for p in (repo_root / "docs").glob("*.md")}
    assert sorted(pages - reachable) == [], "a page of docs/ that README does not lead to"


def _resolves(dotted: str) -> bool:
    """``fnlcore.a.b.C.d``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_fnlcore_name_in_the_documentation_exists(repo_root):
    """A dotted ``fnlcore.x.y`` in README or docs/ is a module or an attribute the code has (a
    renamed registry or function fails here, not in a newcomer's shell)."""
    missing = []
    for page, text in _documentation(repo_root):
        for dotted in sorted(set(re.findall(r"\bfnlcore(?:\.[A-Za-z_]\w*)+", text))):
            if not _resolves(dotted):
                missing.append(f"{page}: {dotted}")
    assert missing == []


def test_registry_names_in_the_documentation_are_the_registries(repo_root):
    """``NAME.from_dict`` / ``NAME.register`` written in README or docs/ names a registry that exists."""
    from fnlcore.datasets import DATASETS
    from fnlcore.methods import METHODS
    from fnlcore.models.builder import MODELS
    from fnlcore.noise import NOISE_MODELS
    from fnlcore.partition import PARTITIONERS

    known = {"METHODS": METHODS, "NOISE_MODELS": NOISE_MODELS, "PARTITIONERS": PARTITIONERS,
             "DATASETS": DATASETS, "MODELS": MODELS}
    wrong = []
    for page, text in _documentation(repo_root):
        for name, attr in re.findall(r"\b([A-Z][A-Z_]+)\.([a-z_]+)\b", text):
            if attr in ("from_dict", "register", "lookup", "builtin", "spec_class") and (
                    name not in known or not hasattr(known[name], attr)):
                wrong.append(f"{page}: {name}.{attr}")
    assert wrong == []
