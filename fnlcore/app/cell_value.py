"""What `fnl cell` prints once a cell's runs are built: the cell's value as its table shows it.

The numbers come from the same summaries and rendering as the table build
(:mod:`fnlcore.app.build_table`), so the cell reads as it will in the table: per metric the
value over the seeds (mean ± std from two seeds on, beside the paper's number where the
paper reports one), each seed's own value, and the metrics file it was read from.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..io import read_parquet
from ..tables import load_reported, render
from ..tables.formats import cell_text, number_text
from .build_table import rounds_averaged, spec_at_rounds, summarise_run
from .papers import PaperTable


def cell_report(pt: PaperTable, row: str, col: str, results: str, seed: int | None = None,
                scale: str | None = None) -> str:
    """The cell (``row``, ``col``) of ``pt`` from the metrics files under ``results``: one block per
    metric, its value as the table prints it, then one line per seed with the file it came from
    (a run not built yet says so). ``scale``: as the user gave it (a scale file's path), for the
    command that builds the table."""
    cell = [tr for tr in pt.runs if tr.row == row and tr.column == col and (seed is None or tr.run.seed == seed)]
    rows, averaged, files, missing = [], {}, {}, []
    for tr in cell:
        path = tr.run.files(results)["metrics"]
        if not Path(path).exists():
            missing.append(path)
            continue
        df = read_parquet(path)
        rows += summarise_run(pt, tr, df)
        for name, k in rounds_averaged(pt, tr, df).items():
            averaged.setdefault(name, []).append(k)
        files[tr.run.seed] = path
    runs = pd.DataFrame(rows, columns=["row", "column", "metric", "seed", "value"])
    reported = load_reported(pt.reported) if pt.reported is not None else None
    rendered = render(spec_at_rounds(pt, averaged or None), runs, reported)
    lines = [f"Cell {pt.name} at scale {pt.scale}, row {row!r}, column {col!r}:"]
    for metric in rendered.spec.metrics:
        line = rendered.long[(rendered.long.row == row) & (rendered.long.column == col)
                             & (rendered.long.metric == metric.name)]
        if line.empty:
            continue
        what = f", {metric.definition}" if metric.definition else ""
        lines.append(f"  {metric.label or metric.name}{what}: {cell_text(rendered, line.iloc[0])}")
        for r in runs[runs.metric == metric.name].sort_values("seed").itertuples():
            lines.append(f"    seed {r.seed}: {number_text(r.value * metric.scale, metric.decimals)}"
                         f"  {files[r.seed]}")
    lines += [f"  not built yet: {path}" for path in missing]
    md = pt.outputs(results)["md"]
    build = f"snakemake --cores N --config 'tables=[\"{pt.paper}/{pt.table}\"]' scale={scale or pt.scale}"
    built = "" if Path(md).exists() else f" (not built yet: `{build}` builds it with every cell)"
    lines.append(f"  table: {md}{built}")
    return "\n".join(lines)
