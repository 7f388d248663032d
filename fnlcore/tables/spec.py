"""A paper table as data: its rows, columns, metrics and comparison settings.

A cell is identified by (row label, column label, metric name). Rows are
methods (and their variants), columns are data/noise settings, metrics are the
per-cell numbers (e.g. FedNoRo's Best and Last BACC). Reproduced runs use these
labels; reported numbers are placed into cells through *keys*: each row and
column names the values its reported-CSV fields take (``TableSpec.row_fields``,
``TableSpec.column_fields``), and each metric the value of the CSV ``metric``
column.

Example (FedNoRo Table 1, one row, one column)::

    TableSpec(
        paper="fednoro", table="1", title="BACC (%) on ICH",
        rows=(RowSpec("FedAvg"),),
        columns=(ColumnSpec("rho=0.2 (0.3,0.5)", key=("H-IDN rho=0.2, (eta_l,eta_u)=(0.3,0.5)",)),),
        metrics=(MetricSpec("bacc_best_round", "Best"), MetricSpec("bacc_mean_last10_rounds", "Last")),
        row_fields=("method",), column_fields=("noise_setting",),
    )
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Iterable, Literal, Mapping, Sequence

import pandas as pd

from ..errors import ConfigError

RowStatus = Literal["implemented", "not_implemented"]

DEFAULT_TOLERANCE = 1.0
"""Absolute tolerance in table units (percentage points) when a spec gives none."""


def _key(value: Any, label: str, n_fields: int, where: str) -> tuple[str, ...]:
    """Normalise a key to a tuple of strings, one per key field (YAML numbers become strings)."""
    if value is None:
        if n_fields != 1:
            raise ConfigError(
                f"{where}: give 'key' with {n_fields} values (one per key field); "
                "the label can stand in for the key only when there is one key field"
            )
        return (label,)
    key = _as_key(value)
    if len(key) != n_fields:
        raise ConfigError(f"{where}: key {key} has {len(key)} values but there are {n_fields} key fields")
    return key


@dataclass(frozen=True)
class RowSpec:
    """One table row (a method or a variant).

    label: the row's name in the rendered table and in reproduced runs.
    status: ``"implemented"`` or ``"not_implemented"`` (rendered "n.i.").
    note: free text shown in the table notes.
    key: values of the table's ``row_fields`` in the reported CSV; ``None``
        means ``(label,)`` (allowed when there is a single row field).
    average_of: per-row override of derived columns' ``average_of``, as
        ``{derived column label: [measured column labels]}`` (stored as sorted
        ``(label, labels)`` pairs). The papers that average differently per row:
        FedGR Tables 14-15 include the clean column in FedAvg's, FedProx's and
        FedGR's Avg only (fedgr.md section 5). Checked against the table's columns
        by :class:`TableSpec`.
    """

    label: str
    status: RowStatus = "implemented"
    note: str = ""
    key: tuple[str, ...] | None = None
    average_of: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label:
            raise ConfigError(f"row label {self.label!r}: must be a non-empty string")
        if self.status not in ("implemented", "not_implemented"):
            raise ConfigError(
                f"row {self.label!r}: status={self.status!r} is not valid; use 'implemented' or 'not_implemented'"
            )
        if self.key is not None:
            object.__setattr__(self, "key", _as_key(self.key))
        if self.average_of is not None:
            object.__setattr__(self, "average_of", _row_averages(self.label, self.average_of))

    def averages(self, column: str) -> tuple[str, ...] | None:
        """The columns this row averages for derived column ``column`` (``None``: the column's own list)."""
        return dict(self.average_of or ()).get(column)


@dataclass(frozen=True)
class ColumnSpec:
    """One table column (a data partition / noise setting).

    label: the column's name in the rendered table and in reproduced runs.
    note: free text shown in the table notes.
    key: values of the table's ``column_fields`` in the reported CSV
        (``None`` = ``(label,)``, single field only).
    average_of: labels of other columns; this column is then derived, not run: per
        row, metric and seed, the mean of those columns' values (a seed counts only
        when every listed column has it), then mean and std over seeds as any cell.
        The papers' "Avg" columns (FedGR Tables 1-2, FedMLP Tables 1-2).
    """

    label: str
    note: str = ""
    key: tuple[str, ...] | None = None
    average_of: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label:
            raise ConfigError(f"column label {self.label!r}: must be a non-empty string")
        if self.key is not None:
            object.__setattr__(self, "key", _as_key(self.key))
        if self.average_of is not None:
            labels = (self.average_of,) if isinstance(self.average_of, str) else tuple(self.average_of)
            if not labels or not all(isinstance(x, str) and x for x in labels):
                raise ConfigError(
                    f"column {self.label!r}: average_of={self.average_of!r} must list the labels of other columns"
                )
            object.__setattr__(self, "average_of", labels)


@dataclass(frozen=True)
class MetricSpec:
    """One number per cell.

    name: metric id used by reproduced runs (e.g. ``"bacc_best_round"``).
    label: short header (e.g. ``"Best"``).
    scale: reproduced values (fractions in [0, 1]) are multiplied by it to
        reach table units (100 = percent).
    decimals: digits printed after the decimal point.
    tolerance: absolute tolerance in table units for this metric; ``None``
        uses the table's ``tolerance``.
    reported_name: value of the reported CSV's ``metric`` column (``None`` = name).
    definition: what the number is, in words, printed in every rendering's legend and in
        the CSV's ``metric_definition`` column (e.g. ``"mean test bacc of the last 10 rounds"``;
        ``""``: none given). A table build sets it from the metric's summary rule and the
        rounds its runs actually have (:func:`fnlcore.app.build_table.metric_definition`).
    """

    name: str
    label: str = ""
    scale: float = 100.0
    decimals: int = 2
    tolerance: float | None = None
    reported_name: str | None = None
    definition: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"metric name {self.name!r}: must be a non-empty string")
        if not self.label:
            object.__setattr__(self, "label", self.name)
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(
                f"metric {self.name!r}: scale={self.scale!r} must be a positive number (100 = percent)"
            )
        if not isinstance(self.decimals, int) or isinstance(self.decimals, bool) or not 0 <= self.decimals <= 10:
            raise ConfigError(f"metric {self.name!r}: decimals={self.decimals!r} must be an integer in 0..10")
        if self.tolerance is not None and not _non_negative(self.tolerance):
            raise ConfigError(
                f"metric {self.name!r}: tolerance={self.tolerance!r} must be a number >= 0 (table units)"
            )

    @property
    def reported_key(self) -> str:
        return self.reported_name if self.reported_name is not None else self.name


@dataclass(frozen=True)
class TableSpec:
    """A paper table: ordered rows, columns and metrics, and how to compare with the paper.

    paper, table: identifiers (e.g. ``"fednoro"``, ``"1"``); title: caption.
    rows, columns, metrics: ordered specs; labels/names must be unique.
    tolerance: global absolute tolerance in table units (per-metric
        ``MetricSpec.tolerance`` overrides it); default 1.0 point.
    std_ddof: 0 = population std, 1 = sample std over seeds. Papers differ
        (FedGR: population, fedgr.md section 5; FedDiv: sample, feddiv.md A8).
    row_fields, column_fields: reported-CSV columns whose values form the row
        and column keys (e.g. ``("method",)`` and ``("partition", "noise_setting")``).
    expected_seeds: seeds each cell should have; cells with fewer are marked
        partial when rendered. ``None`` = no expectation.
    note: free text shown under the table.
    scale, scale_note: the scale the table was run at (config key ``scale``) and a line
        describing it, shown in every rendering (``""``: not stated).
    compared_with_paper: False at a scale that changes the table's data or budget: its
        reported numbers are not set beside the reproduced ones.
    """

    paper: str
    table: str
    title: str
    rows: tuple[RowSpec, ...]
    columns: tuple[ColumnSpec, ...]
    metrics: tuple[MetricSpec, ...]
    tolerance: float = DEFAULT_TOLERANCE
    std_ddof: int = 1
    row_fields: tuple[str, ...] = ("method",)
    column_fields: tuple[str, ...] = ("noise_setting",)
    expected_seeds: int | None = None
    note: str = ""
    scale: str = ""
    scale_note: str = ""
    compared_with_paper: bool = True

    def __post_init__(self) -> None:
        where = f"table {self.paper}/{self.table}"
        for name in ("paper", "table"):
            if not str(getattr(self, name)):
                raise ConfigError(f"{where}: {name} must be a non-empty string")
        object.__setattr__(self, "table", str(self.table))
        for name, kind in (("rows", RowSpec), ("columns", ColumnSpec), ("metrics", MetricSpec)):
            items = tuple(getattr(self, name))
            if not items:
                raise ConfigError(f"{where}: {name} is empty; a table needs at least one")
            bad = [type(i).__name__ for i in items if not isinstance(i, kind)]
            if bad:
                raise ConfigError(f"{where}: {name} must hold {kind.__name__} objects, found {bad[:3]}")
            object.__setattr__(self, name, items)
        for name in ("row_fields", "column_fields"):
            flds = getattr(self, name)
            if isinstance(flds, str):
                flds = (flds,)
            flds = tuple(str(f) for f in flds)
            if not flds:
                raise ConfigError(
                    f"{where}: {name} is empty; name the reported-CSV columns that key the {name[:-7]}s"
                )
            object.__setattr__(self, name, flds)
        if not _non_negative(self.tolerance):
            raise ConfigError(f"{where}: tolerance={self.tolerance!r} must be a number >= 0 (table units)")
        if self.std_ddof not in (0, 1) or isinstance(self.std_ddof, bool):
            raise ConfigError(f"{where}: std_ddof={self.std_ddof!r} must be 0 (population std) or 1 (sample std)")
        seeds = self.expected_seeds
        if seeds is not None and (not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1):
            raise ConfigError(f"{where}: expected_seeds={seeds!r} must be a positive integer or None")
        _unique(where, "row label", [r.label for r in self.rows])
        _unique(where, "column label", [c.label for c in self.columns])
        _unique(where, "metric name", [m.name for m in self.metrics])
        _unique(where, "metric reported_name", [m.reported_key for m in self.metrics])
        _unique(where, "row key", [self.row_key(r) for r in self.rows])
        _unique(where, "column key", [self.column_key(c) for c in self.columns])
        measured = {c.label for c in self.columns if c.average_of is None}
        for c in self.columns:
            bad = [x for x in c.average_of or () if x not in measured]
            if bad:
                raise ConfigError(
                    f"{where}: column {c.label!r} averages {bad}, which are not measured columns of the table; "
                    f"measured columns: {sorted(measured)}"
                )
        derived = {c.label for c in self.columns if c.average_of is not None}
        for r in self.rows:
            for col, labels in r.average_of or ():
                if col not in derived:
                    raise ConfigError(
                        f"{where}: row {r.label!r} overrides average_of of {col!r}, which is not an average_of "
                        f"column of the table; average_of columns: {sorted(derived)}"
                    )
                bad = [x for x in labels if x not in measured]
                if bad:
                    raise ConfigError(
                        f"{where}: row {r.label!r} averages {bad} for column {col!r}, which are not measured "
                        f"columns of the table; measured columns: {sorted(measured)}"
                    )

    def average_of(self, row: str, column: str) -> tuple[str, ...] | None:
        """The columns whose per-seed mean is cell (row, column); ``None`` for a measured column.

        The row's own ``average_of`` for that column wins over the column's.
        """
        col = next((c for c in self.columns if c.label == column), None)
        if col is None:
            raise ConfigError(f"table {self.paper}/{self.table} has no column {column!r}")
        if col.average_of is None:
            return None
        r = next((r for r in self.rows if r.label == row), None)
        if r is None:
            raise ConfigError(f"table {self.paper}/{self.table} has no row {row!r}")
        own = r.averages(column)
        return col.average_of if own is None else own

    # -- keys -----------------------------------------------------------------

    def row_key(self, row: RowSpec) -> tuple[str, ...]:
        return _key(row.key, row.label, len(self.row_fields), f"table {self.paper}/{self.table} row {row.label!r}")

    def column_key(self, col: ColumnSpec) -> tuple[str, ...]:
        where = f"table {self.paper}/{self.table} column {col.label!r}"
        return _key(col.key, col.label, len(self.column_fields), where)

    def metric(self, name: str) -> MetricSpec:
        for m in self.metrics:
            if m.name == name:
                return m
        raise ConfigError(f"table {self.paper}/{self.table} has no metric {name!r}")

    def tolerance_of(self, metric: MetricSpec) -> float:
        return float(self.tolerance if metric.tolerance is None else metric.tolerance)

    def cells(self) -> pd.DataFrame:
        """Every cell in display order (row-major, then column, then metric)."""
        return pd.DataFrame(
            [(r.label, c.label, m.name) for r in self.rows for c in self.columns for m in self.metrics],
            columns=["row", "column", "metric"],
        )

    # -- construction ---------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TableSpec":
        """Build from plain data (a ``config/papers/<paper>.yaml`` entry).

        rows/columns: lists of labels or of mappings with RowSpec/ColumnSpec
        fields; metrics: list of names or of mappings with MetricSpec fields.
        Unknown keys are rejected by name.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"table spec must be a mapping, got {type(d).__name__}")
        where = f"table {d.get('paper', '?')}/{d.get('table', '?')}"
        _no_unknown(where, d, {f.name for f in fields(cls)})
        missing = [k for k in ("paper", "table", "rows", "columns", "metrics") if k not in d]
        if missing:
            raise ConfigError(f"{where}: missing key(s) {missing}")
        args = dict(d)
        args["title"] = str(d.get("title", ""))
        parts = (("rows", RowSpec, "label"), ("columns", ColumnSpec, "label"), ("metrics", MetricSpec, "name"))
        for name, kind, first in parts:
            items = _seq(d[name], where, name)
            args[name] = tuple(_item(kind, v, f"{where}.{name}[{i}]", first) for i, v in enumerate(items))
        for k in ("row_fields", "column_fields"):
            if k in d:
                v = d[k]
                args[k] = (v,) if isinstance(v, str) else tuple(v)
        return cls(**args)

    @classmethod
    def from_reported(
        cls,
        reported: pd.DataFrame,
        row_fields: Sequence[str] = ("method",),
        column_fields: Sequence[str] = ("noise_setting",),
        *,
        paper: str | None = None,
        table: str | None = None,
        title: str = "",
        **options: Any,
    ) -> "TableSpec":
        """A spec whose rows, columns and metrics are those of a reported CSV, in order of appearance.

        Labels are the key values joined with " | ". Useful to bootstrap a
        ``config/papers`` entry and to check that a reported table's keys are
        unique. ``options`` are further TableSpec fields (tolerance, std_ddof, ...).
        """
        row_fields, column_fields = tuple(row_fields), tuple(column_fields)
        check_fields(reported, row_fields + column_fields + ("metric",), "TableSpec.from_reported")
        rkeys = _ordered_keys(reported, row_fields)
        ckeys = _ordered_keys(reported, column_fields)
        mkeys = [k[0] for k in _ordered_keys(reported, ("metric",))]
        paper = paper if paper is not None else _first(reported, "paper", "paper")
        table = table if table is not None else _first(reported, "table", "table")
        return cls(
            paper=paper,
            table=table,
            title=title,
            rows=tuple(RowSpec(" | ".join(k), key=k) for k in rkeys),
            columns=tuple(ColumnSpec(" | ".join(k), key=k) for k in ckeys),
            metrics=tuple(MetricSpec(m) for m in mkeys),
            row_fields=row_fields,
            column_fields=column_fields,
            **options,
        )


# ----------------------------------------------------------------------------- helpers


def _as_key(value: Any) -> tuple[str, ...]:
    """A single value (str or number) or a sequence of values -> tuple of strings."""
    if isinstance(value, (str, int, float)):
        return (str(value),)
    return tuple(str(v) for v in value)


def _row_averages(label: str, value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A row's ``average_of`` (a mapping or (column, labels) pairs) -> sorted (column, labels) pairs."""
    where = f"row {label!r}: average_of"
    pairs = value.items() if isinstance(value, Mapping) else value
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise ConfigError(f"{where}={value!r} must map average_of column labels to lists of column labels")
    out: dict[str, tuple[str, ...]] = {}
    for pair in pairs:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ConfigError(f"{where}={value!r} must map average_of column labels to lists of column labels")
        col, labels = pair
        labels = (labels,) if isinstance(labels, str) else labels
        if isinstance(labels, (bytes, Mapping)) or not isinstance(labels, Iterable):
            raise ConfigError(f"{where}[{col!r}]={labels!r} must list the labels of measured columns")
        labels = tuple(labels)
        if not isinstance(col, str) or not col or col in out:
            raise ConfigError(f"{where}: column label {col!r} must be a non-empty string, given once")
        if not labels or not all(isinstance(x, str) and x for x in labels):
            raise ConfigError(f"{where}[{col!r}]={labels!r} must list the labels of measured columns")
        _unique(where + f"[{col!r}]", "column label", labels)
        out[col] = labels
    if not out:
        raise ConfigError(f"{where} is empty; leave it out to use the columns' own average_of")
    return tuple(sorted(out.items()))


def _non_negative(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _unique(where: str, what: str, values: Iterable[Any]) -> None:
    seen: set[Any] = set()
    dup = []
    for v in values:
        if v in seen:
            dup.append(v)
        seen.add(v)
    if dup:
        raise ConfigError(f"{where}: duplicate {what}(s) {dup[:5]}; every {what} must be unique")


def _no_unknown(where: str, d: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _seq(v: Any, where: str, name: str) -> list[Any]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
        raise ConfigError(f"{where}: {name} must be a list")
    return list(v)


def _item(kind: type, v: Any, where: str, first: str) -> Any:
    if isinstance(v, kind):
        return v
    if isinstance(v, str):
        return kind(v)
    if not isinstance(v, Mapping):
        raise ConfigError(f"{where}: expected a {first} or a mapping, got {type(v).__name__}")
    _no_unknown(where, v, {f.name for f in fields(kind)})
    args = dict(v)
    try:
        return kind(**args)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where}: {e}") from None


def _ordered_keys(df: pd.DataFrame, flds: tuple[str, ...]) -> list[tuple[str, ...]]:
    sub = df.loc[:, list(flds)].astype(str).drop_duplicates()
    return [tuple(r) for r in sub.itertuples(index=False, name=None)]


def _first(df: pd.DataFrame, col: str, name: str) -> str:
    if col not in df.columns or df.empty:
        raise ConfigError(f"TableSpec.from_reported: give {name}=...; the reported table has no {col!r} value")
    return str(df[col].iloc[0])


def check_fields(df: pd.DataFrame, flds: Sequence[str], where: str) -> None:
    missing = [f for f in flds if f not in df.columns]
    if missing:
        raise ConfigError(
            f"{where}: key field(s) {missing} are not columns of the reported table; columns: {list(df.columns)}; "
            "add them to the CSV, or change the table's row_fields/column_fields"
        )
