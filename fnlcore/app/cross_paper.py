"""The cross-paper view: one line per table cell whose run configuration another table also reports.

Two cells of the selected tables are *the same experiment* when their runs have the same
configuration key: dataset, partition slug, noise slug, training slug and method slug (the
path of a run without its seeds, :func:`config_key`). Seeds are left out of the key on
purpose: they are replicate draws of one experiment, and a paper's number is a claim about the
configuration, not about its seeds; two tables that used other seeds for the same setting still
report the same experiment. The reproduced value of a group is therefore taken over the union
of its cells' runs (every seed any selected table asks for), so it is the *one* reproduction of
that configuration, and the ``seeds`` column says which seeds it averages.

A group is kept when at least two tables (of one paper or of several) hold a cell with that
key. Per group and per cell the view shows the paper, table, row, column and metric, the
number the paper reports for that cell (at a scale compared with the papers; else none), and
the reproduced mean ± std over the group's runs summarised with *that cell's* metric. Papers
report different metrics (best round vs mean of the last rounds, accuracy vs balanced
accuracy): every line names its metric in words, and ``reported_spread`` (max - min of the
reported numbers) compares only lines with the same metric definition. Where a paper's setting
is "the same" only nominally (one paper copies another's numbers), the view shows what each
declares.

Pure pandas; the workflow's rule ``cross_paper`` (rules/cross_paper.smk) writes
``results/tables/<scale>/cross_paper.{csv,md}``, the Markdown first and the CSV last.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
from ..io import write_csv
from ..metrics import summarise
from ..tables.reported import load_reported, place_reported
from .build_table import _written_together, metric_definition

# results/tables/<scale>/cross_paper.{csv,md}: beside the papers' folders of that scale
CROSS_PAPER = "{results}/tables/{scale}/cross_paper"
CROSS_PAPER_FILES = {"csv": ".csv", "md": ".md"}
KEY_FIELDS = ("dataset", "partition", "noise", "train", "method")

COLUMNS = [
    "group", "configuration", "dataset", "partition", "noise", "train", "method", "n_tables", "n_papers",
    "paper", "table", "row", "column", "metric", "metric_label", "metric_definition",
    "reported", "reported_std", "reproduced_mean", "reproduced_std", "n_seeds", "seeds", "delta",
    "reported_spread", "status", "scale",
]


def config_key(run: Any) -> tuple[str, ...]:
    """The configuration of a run (a :class:`~fnlcore.app.runs.RunSpec`) without its seeds."""
    f = run.fields()
    return tuple(str(f[k]) for k in KEY_FIELDS)


@dataclass
class Cell:
    """One cell (row x column) of one table whose runs have the group's configuration."""

    table: Any  # fnlcore.app.papers.PaperTable
    row: str
    column: str


@dataclass
class SharedGroup:
    """A configuration held by cells of at least two tables, and its distinct runs (all seeds)."""

    key: tuple[str, ...]
    cells: list[Cell] = field(default_factory=list)
    runs: list[Any] = field(default_factory=list)  # RunSpec, one per distinct run folder

    @property
    def tables(self) -> list[str]:
        return list(dict.fromkeys(c.table.name for c in self.cells))

    @property
    def papers(self) -> list[str]:
        return list(dict.fromkeys(c.table.paper for c in self.cells))

    def describe(self) -> str:
        """The configuration in words (slugs as in the run folders; seeds of the group's runs)."""
        dataset, partition, noise, train, method = self.key

        def seeds(attr: str) -> str:
            return ",".join(str(s) for s in sorted({getattr(r, attr) for r in self.runs}))

        return (f"{dataset}; partition {partition} (partition seed {seeds('partition_seed')}); "
                f"noise {noise} (noise seed {seeds('noise_seed')}); training {train}; method {method}")


@dataclass
class CrossPaper:
    """The shared configurations of the selected tables at one scale."""

    scale: str
    groups: list[SharedGroup]

    @property
    def compared(self) -> bool:
        """The scale keeps the papers' settings, so the reported numbers are shown."""
        return all(c.table.spec.compared_with_paper for g in self.groups for c in g.cells)

    def outputs(self, results: str) -> dict[str, str]:
        base = CROSS_PAPER.format(results=results, scale=self.scale)
        return {k: base + s for k, s in CROSS_PAPER_FILES.items()}

    def targets(self, results: str) -> list[str]:
        """The view's files when some configuration is shared, else none (nothing to build)."""
        return list(self.outputs(results).values()) if self.groups else []

    def runs(self) -> list[Any]:
        return [r for g in self.groups for r in g.runs]

    def metrics_files(self, results: str) -> list[str]:
        """Every run's metrics file, in :meth:`runs` order (the rule's inputs; no run outside the tables')."""
        return [r.files(results)["metrics"] for r in self.runs()]

    def reported_files(self) -> list[str]:
        tables = {c.table.name: c.table for g in self.groups for c in g.cells}
        return sorted({str(t.reported) for t in tables.values() if t.reported is not None})

    def content_digest(self) -> str:
        """A digest of what changes the view besides its inputs: groups, cells, metrics, scale."""
        content = [(self.scale, g.key, [(c.table.name, c.row, c.column, c.table.spec.metrics,
                                         sorted(c.table.metrics.items()), c.table.spec.std_ddof,
                                         c.table.reported.name if c.table.reported is not None else None)
                                        for c in g.cells],
                    [sorted(r.fields().items()) for r in g.runs]) for g in self.groups]
        return hashlib.sha256(repr(content).encode()).hexdigest()[:16]


def shared_groups(tables: Sequence[Any], scale: str | None = None) -> CrossPaper:
    """Group the cells of ``tables`` (PaperTables of one scale) by :func:`config_key`; keep the
    keys that cells of at least two tables hold. Groups and cells keep the tables' order."""
    by_key: dict[tuple[str, ...], SharedGroup] = {}
    run_seen: dict[tuple[str, ...], set] = {}
    for t in tables:
        for tr in t.runs:
            key = config_key(tr.run)
            g = by_key.setdefault(key, SharedGroup(key))
            if not any(c.table is t and c.row == tr.row and c.column == tr.column for c in g.cells):
                g.cells.append(Cell(t, tr.row, tr.column))
            ident = tuple(sorted(tr.run.fields().items()))
            if ident not in run_seen.setdefault(key, set()):
                run_seen[key].add(ident)
                g.runs.append(tr.run)
    groups = [g for g in by_key.values() if len(g.tables) >= 2]
    if scale is None:
        scale = tables[0].scale if tables else "paper"
    return CrossPaper(scale=scale, groups=groups)


def _summary_rule(run: Any, rule: Any) -> Any:
    """The table metric's rule for one run, limited to the method's reported stages (as a table does)."""

    if rule.stages is not None:
        return rule
    # lazy: imports torch; fnlcore.app.cross_paper imports without it (envs/labels.yaml)
    from ..methods import METHODS

    stages = getattr(METHODS[run.method.name], "reported_stages", None)
    return rule if stages is None else replace(rule, stages=tuple(stages))


def _reported_cells(table: Any, cache: dict[str, pd.DataFrame]) -> pd.DataFrame:
    if table.name not in cache:
        reported = load_reported(table.reported) if table.reported is not None else None
        cache[table.name] = place_reported(table.spec, reported)[0]
    return cache[table.name]


def cross_paper_long(cp: CrossPaper, metrics: Sequence[pd.DataFrame | None]) -> pd.DataFrame:
    """One line per (group, cell, metric of the cell's table): reported beside reproduced.

    ``metrics``: the per-round table of each run of :meth:`CrossPaper.runs`, in that order;
    ``None`` for a run not done yet (its cell shows fewer seeds, or ``pending``). Values are in
    table units (the metric's ``scale``, 100 = percent).
    """
    if len(metrics) != len(cp.runs()):
        raise ValueError(f"cross-paper view: {len(metrics)} metrics tables for {len(cp.runs())} runs")

    lines: list[dict] = []
    reported_cache: dict[str, pd.DataFrame] = {}
    offset = 0
    for gi, g in enumerate(cp.groups, start=1):
        words = g.describe()
        frames = metrics[offset:offset + len(g.runs)]
        offset += len(g.runs)
        for c in g.cells:
            t = c.table
            rep = _reported_cells(t, reported_cache)
            for m in t.spec.metrics:
                mr = t.metrics.get(m.name)
                if mr is None:
                    continue
                values, seeds = [], []
                for run, df in zip(g.runs, frames):
                    if df is not None:
                        values.append(_summarise(df, mr.source, _summary_rule(run, mr.rule)))
                        seeds.append(run.seed)
                n = len(values)
                mean = sum(values) / n * m.scale if n else math.nan
                std = _std(values, t.spec.std_ddof) * m.scale if n >= 2 else math.nan
                hit = rep[(rep["row"] == c.row) & (rep["column"] == c.column) & (rep["metric"] == m.name)]
                reported = float(hit["reported"].iloc[0]) if len(hit) else math.nan
                reported_std = float(hit["reported_std"].iloc[0]) if len(hit) else math.nan
                status = ("done" if n else "pending") if not math.isnan(reported) else "not_reported"
                lines.append({
                    "group": gi, "configuration": words, **dict(zip(KEY_FIELDS, g.key)),
                    "n_tables": len(g.tables), "n_papers": len(g.papers),
                    "paper": t.paper, "table": t.table, "row": c.row, "column": c.column, "metric": m.name,
                    "metric_label": m.label, "metric_definition": m.definition or metric_definition(mr.source, mr.rule),
                    "reported": reported, "reported_std": reported_std, "reproduced_mean": mean,
                    "reproduced_std": std, "n_seeds": n, "seeds": ",".join(str(s) for s in sorted(seeds)),
                    "delta": mean - reported if status == "done" else math.nan,
                    "reported_spread": math.nan, "status": status, "scale": cp.scale,
                })
    out = pd.DataFrame(lines, columns=COLUMNS)
    if len(out):
        # the papers' disagreement: max - min of the reported numbers of one metric definition in one group
        rep = out.groupby(["group", "metric_definition"])["reported"]
        spread = (rep.transform("max") - rep.transform("min")).where(rep.transform("count") >= 2)
        out["reported_spread"] = spread
    return out


def _summarise(df: pd.DataFrame, source: str, rule: Any) -> float:
    return summarise(df, source, rule)


def _std(values: Sequence[float], ddof: int) -> float:
    n = len(values)
    if n - ddof <= 0:
        return math.nan
    mu = sum(values) / n
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (n - ddof))


def _num(x: float, decimals: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{decimals}f}".replace("-", "−")


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|")


def to_markdown(cp: CrossPaper, long: pd.DataFrame) -> str:
    """The view as Markdown: one section per shared configuration, one line per cell and metric."""
    n_cross = sum(len(g.papers) >= 2 for g in cp.groups)
    head = [
        f"# Configurations reported in several tables (scale {cp.scale})",
        "",
        f"{len(cp.groups)} run configuration(s) appear in cells of at least two selected tables; "
        f"{n_cross} of them in tables of different papers. A configuration is the run path without its seeds "
        "(dataset, partition, noise, training and method slugs); its reproduction averages every run of "
        "it that the selected tables ask for (the seeds listed). Each line is one cell of one table, with "
        "that table's metric: compare reported numbers only between lines with the same metric. "
        "Spread = highest minus lowest reported number of that metric in the group.",
        "",
    ]
    if not cp.compared:
        head += [f"Scale {cp.scale} is not compared with the reported numbers, which need the tables' own "
                 "settings: the Reported column is empty.", ""]
    if not cp.groups:
        return "\n".join(head + ["No configuration is shared by two selected tables.", ""])
    body: list[str] = []
    decimals = {(c.table.name, m.name): m.decimals for g in cp.groups for c in g.cells for m in c.table.spec.metrics}
    for gi, g in enumerate(cp.groups, start=1):
        sub = long[long["group"] == gi]
        papers = ", ".join(g.papers)
        body += [f"## {gi}. {_md(g.describe())}", "", f"Tables: {', '.join(g.tables)} (papers: {papers}).", "",
                 "| Paper | Table | Row | Column | Metric | Reported | Reproduced | Δ | Spread |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for _, ln in sub.iterrows():
            d = decimals.get((f"{ln['paper']}/{ln['table']}", ln["metric"]), 2)
            rep = _num(ln["reported"], d)
            if not math.isnan(ln["reported_std"]):
                rep += f" ± {_num(ln['reported_std'], d)}"
            if ln["n_seeds"]:
                repro = _num(ln["reproduced_mean"], d)
                if not math.isnan(ln["reproduced_std"]):
                    repro += f" ± {_num(ln['reproduced_std'], d)}"
                repro += f" ({ln['n_seeds']} seed{'s' if ln['n_seeds'] != 1 else ''})"
            else:
                repro = "pending"
            delta = "–" if math.isnan(ln["delta"]) else f"{ln['delta']:+.{d}f}".replace("-", "−")
            metric = f"{ln['metric_label']}: {ln['metric_definition']}"
            body.append(f"| {_md(ln['paper'])} | {_md(ln['table'])} | {_md(ln['row'])} | {_md(ln['column'])} | "
                        f"{_md(metric)} | {rep} | {repro} | {delta} | {_num(ln['reported_spread'], d)} |")
        body.append("")
    return "\n".join(head + body)


def build_cross_paper(cp: CrossPaper, metrics_files: Sequence[str], outputs: Mapping[str, str],
                      read_metrics: Callable[[str], pd.DataFrame]) -> pd.DataFrame:
    """Write the view from its runs' metrics files (the rule's inputs, in :meth:`CrossPaper.runs`
    order); ``outputs`` maps csv and md to their paths. Both are written to temporary files and
    renamed into place together, the CSV last (a killed job leaves no CSV)."""

    if len(metrics_files) != len(cp.runs()):
        raise ValueError(f"cross-paper view: {len(metrics_files)} metrics files for {len(cp.runs())} runs")
    long = cross_paper_long(cp, [read_metrics(str(p)) for p in metrics_files])
    with _written_together(outputs) as tmp:
        Path(tmp["md"]).write_text(to_markdown(cp, long), encoding="utf-8")
        write_csv(long, tmp["csv"])
    return long
