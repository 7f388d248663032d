"""Aggregation of reproduced runs over seeds: mean, std and seed count per cell."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError

RUN_COLUMNS = ("row", "column", "metric", "seed", "value")
KEY = ["row", "column", "metric"]


def check_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Validate a runs table (one summary value per cell and seed); return it with float values."""
    if not isinstance(runs, pd.DataFrame):
        raise DataError(f"runs must be a DataFrame with columns {list(RUN_COLUMNS)}, got {type(runs).__name__}")
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise DataError(f"runs table lacks column(s) {missing}; required: {list(RUN_COLUMNS)}")
    out = runs.loc[:, list(RUN_COLUMNS)].copy()
    values = pd.to_numeric(out["value"], errors="coerce")
    bad = values.isna() & out["value"].notna()
    if bad.any():
        raise DataError(f"runs table: 'value' holds non-numbers, e.g. {out['value'][bad].iloc[0]!r}")
    out["value"] = values.astype(np.float64)
    for c in KEY:
        out[c] = out[c].astype(str)
    dup = out.duplicated(KEY + ["seed"], keep=False)
    if dup.any():
        r = out[dup].iloc[0]
        raise DataError(
            f"runs table has several values for cell ({r['row']!r}, {r['column']!r}, {r['metric']!r}) "
            f"seed {r['seed']!r}; keep one summary value per cell and seed"
        )
    return out


def aggregate_runs(runs: pd.DataFrame, ddof: int = 1) -> pd.DataFrame:
    """Mean, std and number of seeds of every cell.

    runs: columns row, column, metric, seed, value (one value per cell and
        seed, in the metric's raw units; extra columns are ignored).
    ddof: 1 = sample std (default), 0 = population std. With a single seed the
        sample std is NaN (undefined) and the population std 0.
    Returns columns row, column, metric, mean, std, n_seeds, sorted by
    (row, column, metric). Seeds are summed in seed order, so the result does
    not depend on the input order. A NaN value (a run whose metric was
    undefined) makes its cell's mean and std NaN rather than being dropped.
    """
    if ddof not in (0, 1) or isinstance(ddof, bool):
        raise ConfigError(f"ddof={ddof!r} must be 0 (population std) or 1 (sample std)")
    r = check_runs(runs)
    if r.empty:
        return pd.DataFrame(
            {
                "row": pd.Series(dtype=object),
                "column": pd.Series(dtype=object),
                "metric": pd.Series(dtype=object),
                "mean": pd.Series(dtype=np.float64),
                "std": pd.Series(dtype=np.float64),
                "n_seeds": pd.Series(dtype=np.int64),
            }
        )
    r = r.sort_values(KEY + ["seed"], kind="stable")
    g = r.groupby(KEY, sort=True)["value"]
    out = pd.DataFrame(
        {
            "mean": g.mean(skipna=False),
            "std": g.std(ddof=ddof, skipna=False),
            "n_seeds": g.size().astype(np.int64),
        }
    ).reset_index()
    for c in KEY:
        out[c] = out[c].astype(object)
    return out[KEY + ["mean", "std", "n_seeds"]]
