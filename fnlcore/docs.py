"""Reference tables of the docs/ pages, generated from the code so they cannot drift.

    python -m fnlcore.docs            rewrite the generated sections of every page in PAGES
    python -m fnlcore.docs --check    exit 1 if a page is out of date (a test runs this)

A generated section sits between ``<!-- BEGIN generated:NAME -->`` and
``<!-- END generated:NAME -->`` in the page that PAGES names for it.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from .datasets import DATASETS as REGISTRY
from .fl.settings import TrainSettings
from .noise import NOISE_MODELS, noise_models_markdown
from .partition import PARTITIONERS, partitioners_markdown

ROOT = Path(__file__).resolve().parent.parent

# page (relative to the repository root) -> the generated sections it holds
PAGES: dict[str, tuple[str, ...]] = {
    "docs/datasets.md": ("datasets",),
    "docs/partitioners.md": ("partitioners",),
    "docs/noise-models.md": ("noise",),
    "docs/methods.md": ("methods", "training", "batched"),
    "docs/switches.md": ("switches",),
}


def methods_markdown() -> str:
    from .methods import METHODS  # lazy: imports torch; fnlcore.docs imports without it (envs/labels.yaml)

    return METHODS.markdown(("name", "hyper-parameters (defaults)", "from", "code≠paper switches")).rstrip("\n")


def batched_markdown() -> str:
    """Which built-in methods' stages the batched engine runs (from their stage tables)."""
    from .methods import METHODS  # lazy: imports torch; fnlcore.docs imports without it (envs/labels.yaml)

    builtin = METHODS.builtin()
    rows, sequential = [], []
    for name in sorted(builtin):
        stages = builtin[name].stages
        batched = [s for s, st in stages.items() if st.batchable]
        if not batched:
            sequential.append(f"`{name}`")
            continue
        rest = [s for s in stages if s not in batched]
        rows.append(f"`{name}` ({', '.join(batched)}" + (f"; sequential: {', '.join(rest)}" if rest else "") + ")")
    return (f"Batched ({len(rows)} of {len(builtin)} methods; the stages that batch): " + ", ".join(rows)
            + f". Sequential only: {', '.join(sequential) or 'none'}.")


def training_markdown() -> str:
    return "`" + "`, `".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(TrainSettings)) + "`"


def datasets_markdown() -> str:
    DATASETS = REGISTRY.builtin()
    lines = ["| name | classes | labels | input | storage | papers | source |", "|---|---|---|---|---|---|---|"]
    for name in sorted(DATASETS):
        i = DATASETS[name]
        if name.startswith("synthetic_"):
            continue
        how = "placed by hand" if i.manual else ("in memory" if i.in_memory else "on disk")
        kind = "multi-label" if i.multi_label else "single-label"
        lines.append(
            f"| `{name}` | {i.num_classes} | {kind} | {i.channels}×{i.image_size[0]}×{i.image_size[1]} | {how} | "
            f"{', '.join(i.papers) or '—'} | {i.source} |"
        )
    synth = sorted(n for n in DATASETS if n.startswith("synthetic_"))
    lines.append(f"\nSmoke-scale stand-ins (same classes, channels, size and label type, generated): {', '.join(f'`{n}`' for n in synth)}.")
    return "\n".join(lines)


def switches_markdown() -> str:
    """Every code≠paper switch of the built-in methods, noise models and partitioners, one line each."""
    from .methods import METHODS  # lazy: imports torch; fnlcore.docs imports without it (envs/labels.yaml)

    lines = ["| kind | name | switch | code (default) vs paper |", "|---|---|---|---|"]
    for kind, registry in (("method", METHODS), ("noise model", NOISE_MODELS), ("partitioner", PARTITIONERS)):
        for name in sorted(registry.builtin()):
            for field, text in registry.spec_class(name).switches.items():
                cell = text.replace("\n", " ").replace("|", "\\|")
                lines.append(f"| {kind} | `{name}` | `{field}` | {cell} |")
    return "\n".join(lines)


def sections() -> dict[str, str]:
    return {
        "datasets": datasets_markdown(),
        "partitioners": partitioners_markdown(),
        "noise": noise_models_markdown(),
        "methods": methods_markdown(),
        "batched": batched_markdown(),
        "training": training_markdown(),
        "switches": switches_markdown(),
    }


def render(text: str, names: tuple[str, ...], page: str = "the page") -> str:
    """``text`` with its generated sections ``names`` rewritten from the code."""
    bodies = sections()
    for name in names:
        pat = re.compile(rf"(<!-- BEGIN generated:{name} -->\n).*?(\n<!-- END generated:{name} -->)", re.S)
        if not pat.search(text):
            raise SystemExit(f"{page} has no generated section {name!r}: add the BEGIN/END markers of "
                             f"fnlcore/docs.py, or move the section's entry in PAGES to the page that has them")
        text = pat.sub(lambda m: m.group(1) + bodies[name] + m.group(2), text)
    return text


def stale_pages(root: Path = ROOT) -> list[str]:
    """The pages of PAGES whose generated sections differ from what the code generates now."""
    return [page for page, names in PAGES.items()
            if render((root / page).read_text(), names, page) != (root / page).read_text()]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_pages()
        if stale:
            print(f"{', '.join(stale)} out of date: run `python -m fnlcore.docs`", file=sys.stderr)
            return 1
        return 0
    for page, names in PAGES.items():
        path = ROOT / page
        path.write_text(render(path.read_text(), names, page))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
