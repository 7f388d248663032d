"""Reference tables for README.md, generated from the code so they cannot drift.

    python -m fnlcore.docs            rewrite the generated sections of README.md
    python -m fnlcore.docs --check    exit 1 if README.md is out of date (a test runs this)

A generated section sits between ``<!-- BEGIN generated:NAME -->`` and
``<!-- END generated:NAME -->``.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def methods_markdown() -> str:
    from .methods import METHODS

    return METHODS.markdown(("name", "hyper-parameters (defaults)", "from", "code≠paper switches")).rstrip("\n")


def batched_markdown() -> str:
    """Which built-in methods' stages the batched engine runs (from their stage tables)."""
    from .methods import METHODS

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
    from .fl.settings import TrainSettings

    return "`" + "`, `".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(TrainSettings)) + "`"


def datasets_markdown() -> str:
    from .datasets import DATASETS as REGISTRY

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


def sections() -> dict[str, str]:
    from .noise import noise_models_markdown
    from .partition import partitioners_markdown

    return {
        "datasets": datasets_markdown(),
        "partitioners": partitioners_markdown(),
        "noise": noise_models_markdown(),
        "methods": methods_markdown(),
        "batched": batched_markdown(),
        "training": training_markdown(),
    }


def render(text: str) -> str:
    for name, body in sections().items():
        pat = re.compile(rf"(<!-- BEGIN generated:{name} -->\n).*?(\n<!-- END generated:{name} -->)", re.S)
        if not pat.search(text):
            raise SystemExit(f"README.md has no generated section {name!r}")
        text = pat.sub(lambda m: m.group(1) + body + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    text = README.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("README.md is out of date: run `python -m fnlcore.docs`", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
