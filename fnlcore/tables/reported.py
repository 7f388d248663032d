"""Reported numbers: the papers' tables in long format, and their placement into cells.

The CSVs (one per paper table; the repository keeps copies under
``config/papers/reported/``) have one line per printed number with at least
the columns :data:`REQUIRED_COLUMNS`; papers add their own (rho, variant,
row_order, ...). An empty ``value`` is a '-' cell of the paper, kept with its
note; an empty ``std`` means no std was printed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from ..io import atomic_path
from .spec import TableSpec, check_fields

REQUIRED_COLUMNS = (
    "paper",
    "table",
    "dataset",
    "partition",
    "noise_setting",
    "method",
    "metric",
    "value",
    "std",
)
NUMERIC_COLUMNS = ("value", "std")


def load_reported(path: str | os.PathLike) -> pd.DataFrame:
    """Read a long-format reported-numbers CSV.

    Every column is read as text (so keys such as ``"0.30"`` or ``"I"`` keep
    their spelling; empty cells are ``""``), except ``value`` and ``std``,
    which become floats with NaN for empty cells. Raises DataError naming the
    file for a missing file, missing required columns or non-numeric values.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"reported-numbers file {p} does not exist; copy the paper's table CSV there")
    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False, na_filter=False)
    except pd.errors.EmptyDataError:
        raise DataError(
            f"reported-numbers file {p} is empty; it needs a header line with {list(REQUIRED_COLUMNS)}"
        ) from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise DataError(f"reported-numbers file {p} is not a readable CSV: {e}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(
            f"reported-numbers file {p} lacks column(s) {missing}; add them to its header line "
            f"(required: {list(REQUIRED_COLUMNS)}; a cell may be empty)"
        )
    for col in NUMERIC_COLUMNS:
        text = df[col].str.strip()
        num = pd.to_numeric(text.where(text != ""), errors="coerce")
        bad = num.isna() & (text != "")
        if bad.any():
            lines = (np.flatnonzero(bad.to_numpy()) + 2).tolist()[:5]
            raise DataError(
                f"reported-numbers file {p}: column {col!r} holds non-numbers on line(s) {lines} "
                f"(e.g. {text[bad].iloc[0]!r}); write numbers, or leave the cell empty for a '-' in the paper"
            )
        df[col] = num.astype(np.float64)
    return df


def check_reported(path: str | os.PathLike, spec: TableSpec) -> None:
    """Everything the table job reads of a reported CSV, checked before any job runs: the file,
    its required columns and numbers, and the columns the spec's row/column keys name.

    Raises ConfigError (the workflow prints it at startup and stops), never DataError: a bad
    CSV found by the table job would come after Snakemake deleted the old table.
    """
    try:
        reported = load_reported(path)
    except DataError as err:
        raise ConfigError(str(err)) from None
    check_fields(reported, spec.row_fields + spec.column_fields + ("metric",), f"reported-numbers file {path}")


def copy_reported(src: str | os.PathLike, dest_dir: str | os.PathLike) -> Path:
    """Validate a reported CSV and copy it atomically into ``dest_dir`` (e.g. ``config/papers/reported``).

    Returns the destination path (same file name). The file is checked with
    :func:`load_reported` first, so a broken CSV is never installed.
    """
    src = Path(src)
    load_reported(src)
    dest = Path(dest_dir) / src.name
    with atomic_path(dest) as tmp:
        shutil.copyfile(src, tmp)
    return dest


def _lookup(keys: list[tuple[str, ...]], labels: list[str], flds: tuple[str, ...], out: str) -> pd.DataFrame:
    table = pd.DataFrame(keys, columns=list(flds), dtype=object).astype(str)
    table[out] = labels
    return table


def place_reported(spec: TableSpec, reported: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Put reported numbers into the spec's cells.

    Returns ``(cells, unmatched)``: ``cells`` has columns row, column, metric,
    reported, reported_std, reported_note (one line per reported number that
    falls into a cell; value NaN for '-' cells); ``unmatched`` holds the
    reported lines that match no (row, column, metric) of the spec (methods or
    settings the spec leaves out, or a key typo). Two reported lines for one
    cell raise DataError: add a field (e.g. ``row_order``) to the keys.
    """
    if reported is None or reported.empty:
        cells = pd.DataFrame(
            {
                "row": pd.Series(dtype=object),
                "column": pd.Series(dtype=object),
                "metric": pd.Series(dtype=object),
                "reported": pd.Series(dtype=np.float64),
                "reported_std": pd.Series(dtype=np.float64),
                "reported_note": pd.Series(dtype=object),
            }
        )
        unmatched = pd.DataFrame(columns=list(REQUIRED_COLUMNS)) if reported is None else reported.copy()
        return cells, unmatched
    where = f"table {spec.paper}/{spec.table}"
    check_fields(reported, spec.row_fields + spec.column_fields + ("metric", "value", "std"), where)
    rep = reported.copy()
    for f in set(spec.row_fields + spec.column_fields + ("metric",)):
        rep[f] = rep[f].astype(str)
    rows = _lookup([spec.row_key(r) for r in spec.rows], [r.label for r in spec.rows], spec.row_fields, "row")
    columns = _lookup(
        [spec.column_key(c) for c in spec.columns], [c.label for c in spec.columns], spec.column_fields, "column"
    )
    metrics = pd.DataFrame(
        {"metric": [m.reported_key for m in spec.metrics], "_metric_name": [m.name for m in spec.metrics]}
    )
    rep["_line"] = np.arange(len(rep)) + 2  # line number in the CSV (header = line 1)
    merged = rep.merge(rows, on=list(spec.row_fields), how="left")
    merged = merged.merge(columns, on=list(spec.column_fields), how="left")
    merged = merged.merge(metrics, on="metric", how="left")
    hit = merged["row"].notna() & merged["column"].notna() & merged["_metric_name"].notna()
    placed = merged[hit]
    dup = placed.duplicated(["row", "column", "_metric_name"], keep=False)
    if dup.any():
        first = placed[dup].iloc[0]
        same = dup & (placed["row"] == first["row"]) & (placed["column"] == first["column"])
        lines = placed.loc[same, "_line"].tolist()
        raise DataError(
            f"{where}: reported lines {lines} all fall into cell "
            f"({first['row']!r}, {first['column']!r}, {first['_metric_name']!r}); "
            "add a distinguishing column (e.g. 'row_order' or 'variant') to row_fields/column_fields"
        )
    note = placed["note"].astype(str) if "note" in placed.columns else pd.Series("", index=placed.index)
    cells = pd.DataFrame(
        {
            "row": placed["row"].astype(object),
            "column": placed["column"].astype(object),
            "metric": placed["_metric_name"].astype(object),
            "reported": placed["value"].astype(np.float64),
            "reported_std": placed["std"].astype(np.float64),
            "reported_note": note.astype(object),
        }
    ).reset_index(drop=True)
    unmatched = reported.loc[~hit.to_numpy()].reset_index(drop=True)
    return cells, unmatched
