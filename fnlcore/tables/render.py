"""Reproduced beside reported: one line per cell with delta, tolerance flag and status."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import DataError
from ..io import atomic_path, write_csv
from .aggregate import aggregate_runs, check_runs
from .reported import place_reported
from .spec import TableSpec
from .formats import status_text, to_html_text, to_markdown_text

STATUSES = ("done", "pending", "not_implemented", "not_reported")
"""Cell status: done = reproduced and reported; pending = reported but no runs yet;
not_implemented = the row's method is not implemented; not_reported = the paper
prints no number ('-') or the reported table has none for this cell."""

LONG_COLUMNS = [
    "row",
    "column",
    "metric",
    "reproduced_mean",
    "reproduced_std",
    "n_seeds",
    "reported",
    "reported_std",
    "delta",
    "tolerance",
    "within_tolerance",
    "status",
    "reported_note",
]

# Absolute slack on top of the tolerance so that a delta printed as exactly the
# tolerance (e.g. 0.50 - 0.00) is not flagged because of binary rounding.
_TOLERANCE_SLACK = 1e-9


@dataclass(frozen=True)
class RenderedTable:
    """A rendered table: the spec, one line per cell (``long``) and unplaced reported lines.

    ``long`` columns: row, column, metric, reproduced_mean, reproduced_std
    (table units, i.e. times the metric's scale; NaN with fewer than two seeds), n_seeds, reported,
    reported_std, delta (= reproduced_mean - reported), tolerance,
    within_tolerance (nullable boolean; only set for "done" cells), status,
    reported_note. Lines are in display order. ``code_note``: the footer naming runs made by
    another code version than the one that built the table ('' when there are none).
    """

    spec: TableSpec
    long: pd.DataFrame
    unmatched_reported: pd.DataFrame
    code_note: str = ""

    def status_counts(self) -> dict[str, int]:
        counts = self.long["status"].value_counts()
        return {s: int(counts.get(s, 0)) for s in STATUSES}

    def cell_counts(self) -> dict[str, int]:
        """Counts per table cell (row x column, all metrics together), as ``fnl tables`` counts:
        done = every expected seed reproduced; pending = implemented, not done;
        not_implemented; plus compared (numbers with a reported value and a reproduction)
        and no_reported (implemented cells without any reported number)."""
        g = self.long.groupby(["row", "column"], sort=False)
        need = self.spec.expected_seeds or 1
        ni = g["status"].first().eq("not_implemented")
        done = g["n_seeds"].min().ge(need) & ~ni
        norep = g["reported"].apply(lambda v: v.isna().all()) & ~ni
        return {
            "cells": int(len(ni)), "done": int(done.sum()), "pending": int((~done & ~ni).sum()),
            "not_implemented": int(ni.sum()), "compared": int((self.long["status"] == "done").sum()),
            "no_reported": int(norep.sum()),
        }

    def n_flagged(self) -> int:
        return int((self.long["within_tolerance"] == False).sum())  # noqa: E712 (nullable boolean)

    def markdown(self) -> str:
        return to_markdown_text(self)

    def html(self) -> str:
        return to_html_text(self)

    def status_line(self) -> str:
        """The table's status in words, as the Markdown and HTML print it ("12 of 12 cells reproduced, ...")."""

        return status_text(self)

    def to_csv(self, path: str | os.PathLike) -> None:
        """The long table as CSV (atomic), with a ``scale`` column when the spec names its scale and
        ``metric_label`` / ``metric_definition`` columns when its metrics are defined in words
        (the CSV's ``metric`` is an id such as ``bacc_mean_last10_rounds``, not a definition)."""
        out = self.long.assign(scale=self.spec.scale) if self.spec.scale else self.long
        if any(m.definition for m in self.spec.metrics):
            out = out.assign(metric_label=out["metric"].map({m.name: m.label for m in self.spec.metrics}),
                             metric_definition=out["metric"].map({m.name: m.definition for m in self.spec.metrics}))
        write_csv(out, path)

    def to_markdown(self, path: str | os.PathLike) -> None:
        """A readable wide Markdown table with legend (atomic)."""
        _write_text(self.markdown(), path)

    def to_html(self, path: str | os.PathLike) -> None:
        """A self-contained HTML page (inline CSS, flagged cells highlighted; atomic)."""
        _write_text(self.html(), path)


def _write_text(text: str, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def render(spec: TableSpec, reproduced_runs: pd.DataFrame | None, reported: pd.DataFrame | None) -> RenderedTable:
    """Aggregate the runs over seeds and set them beside the reported numbers.

    spec: the table (rows, columns, metrics, tolerance, std ddof).
    reproduced_runs: columns row, column, metric, seed, value, one value per
        cell and seed in raw metric units (fractions); labels must be those of
        the spec (DataError names unknown ones). ``None`` or empty = nothing run yet.
    reported: the table's reported numbers as read by
        :func:`~fnlcore.tables.reported.load_reported` (``None`` = none).
    Reproduced means/stds are multiplied by each metric's ``scale``; delta =
    reproduced - reported; a done cell is within tolerance when |delta| <=
    tolerance. Status precedence: not_implemented (row), then done / pending /
    not_reported as defined in :data:`STATUSES`; a not_reported cell still
    shows reproduced values when there are runs.
    """
    if not isinstance(spec, TableSpec):
        raise DataError(f"spec must be a TableSpec, got {type(spec).__name__}")
    cells = spec.cells()
    if reproduced_runs is None:
        reproduced_runs = pd.DataFrame(columns=["row", "column", "metric", "seed", "value"])
    runs = check_runs(reproduced_runs)
    _check_labels(spec, runs)
    runs = with_average_columns(spec, runs)
    agg = aggregate_runs(runs, ddof=spec.std_ddof)
    rep, unmatched = place_reported(spec, reported)

    long = cells.merge(agg, on=["row", "column", "metric"], how="left")
    long = long.merge(rep, on=["row", "column", "metric"], how="left")

    scale = long["metric"].map({m.name: float(m.scale) for m in spec.metrics}).astype(np.float64)
    tol = long["metric"].map({m.name: spec.tolerance_of(m) for m in spec.metrics}).astype(np.float64)
    n_seeds = long["n_seeds"].fillna(0).astype(np.int64)
    mean = long["mean"].astype(np.float64) * scale
    # a std needs two seeds: with one, ddof=0 would print a spread of exactly 0 that nothing measured
    std = (long["std"].astype(np.float64) * scale).where(n_seeds >= 2)
    reported_v = long["reported"].astype(np.float64)

    not_impl_rows = {r.label for r in spec.rows if r.status == "not_implemented"}
    is_ni = long["row"].isin(not_impl_rows).to_numpy()
    has_runs = (n_seeds > 0).to_numpy()
    has_rep = reported_v.notna().to_numpy()
    status = np.where(
        is_ni,
        "not_implemented",
        np.where(has_rep, np.where(has_runs, "done", "pending"), "not_reported"),
    )
    delta = (mean - reported_v).where(pd.Series(status == "done", index=long.index))
    within = pd.Series(pd.NA, index=long.index, dtype="boolean")
    done = status == "done"
    within[done] = (delta[done].abs() <= tol[done] + _TOLERANCE_SLACK).to_numpy()

    note = long["reported_note"].astype(object).where(long["reported_note"].notna(), "")
    out = pd.DataFrame(
        {
            "row": long["row"].astype(object),
            "column": long["column"].astype(object),
            "metric": long["metric"].astype(object),
            "reproduced_mean": mean,
            "reproduced_std": std,
            "n_seeds": n_seeds,
            "reported": reported_v,
            "reported_std": long["reported_std"].astype(np.float64),
            "delta": delta.astype(np.float64),
            "tolerance": tol,
            "within_tolerance": within,
            "status": pd.Series(status, index=long.index).astype(object),
            "reported_note": note,
        }
    )[LONG_COLUMNS]
    return RenderedTable(spec=spec, long=out.reset_index(drop=True), unmatched_reported=unmatched)


def with_average_columns(spec: TableSpec, runs: pd.DataFrame) -> pd.DataFrame:
    """Add the per-seed values of the derived (``average_of``) columns to checked runs.

    For each row, metric and seed: the mean over the listed columns (the row's own
    ``average_of`` for that column when it gives one, else the column's), only when
    every one of them has that seed (a partial average would not be the paper's Avg).
    """
    derived = [c for c in spec.columns if c.average_of is not None]
    if not derived or runs.empty:
        return runs
    parts = [runs[~runs["column"].isin([c.label for c in derived])]]
    for c in derived:
        groups: dict[tuple[str, ...], list[str]] = {}  # the rows that average the same columns
        for r in spec.rows:
            groups.setdefault(spec.average_of(r.label, c.label), []).append(r.label)
        for labels, rows in groups.items():
            sub = runs[runs["column"].isin(labels) & runs["row"].isin(rows)]
            g = sub.groupby(["row", "metric", "seed"], sort=True)["value"]
            nan = sub["value"].isna().groupby([sub["row"], sub["metric"], sub["seed"]], sort=True).sum()
            stats = pd.DataFrame({"value": g.mean().where(nan == 0), "n": g.size()}).reset_index()  # NaN stays NaN
            stats = stats[stats["n"] == len(labels)]
            if len(stats):
                parts.append(stats.assign(column=c.label)[list(runs.columns)])
    return pd.concat(parts, ignore_index=True)


def _check_labels(spec: TableSpec, runs: pd.DataFrame) -> None:
    """Every run must name a row, column and metric of the spec (catches typos and stale runs)."""
    known = {
        "row": {r.label for r in spec.rows},
        "column": {c.label for c in spec.columns},
        "metric": {m.name for m in spec.metrics},
    }
    for col, allowed in known.items():
        unknown = sorted(set(runs[col].unique()) - allowed)
        if unknown:
            raise DataError(
                f"table {spec.paper}/{spec.table}: runs name {col}(s) {unknown[:5]} that the table does not have; "
                f"known {col}s: {sorted(allowed)[:10]}"
            )
