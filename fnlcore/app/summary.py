"""What a finished workflow tells its user: where the tables are and how to see them."""

from __future__ import annotations

from pathlib import Path


def finished_message(plan) -> str:
    """Paths of the configured tables that exist, and the report command."""
    lines, unbuilt = [], []
    for t in plan.tables:
        md = t.outputs(plan.results_dir)["md"]
        if Path(md).exists():
            lines.append(f"  {t.name}: {md} (also .html, .csv, .curves.png)")
        else:
            unbuilt.append(t.name)
    if lines:
        head = "Tables:"
    elif unbuilt:  # e.g. a run with --until noise, or a cell's runs only
        head = f"Artifacts are under {plan.results_dir}/ ({len(unbuilt)} configured table(s) not built yet)."
    else:
        head = f"Artifacts are under {plan.results_dir}/ (no table configured)."
    tail = "Report with every table and figure: snakemake --report report.html (then open report.html)"
    return "\n".join(["", head, *lines, tail, ""])
