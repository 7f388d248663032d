"""Test-metric curves over rounds: one line per run label, mean ± std band over seeds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from ..errors import DataError
from ..io import save_figure

# Formats whose files embed a creation date unless told not to (kept deterministic).
_NO_DATE = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}


def curve_stats(df: pd.DataFrame, metric: str, label: str = "curve") -> pd.DataFrame:
    """Per-round mean, std (population) and seed count of ``metric``.

    ``df`` has a ``round`` column, the metric column and optionally ``seed``
    (several seeds per label give a band). Rounds where the metric is NaN (not
    evaluated) are dropped.
    """
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"curve {label!r}: expected a DataFrame, got {type(df).__name__}")
    for col in ("round", metric):
        if col not in df.columns:
            raise DataError(f"curve {label!r} has no column {col!r} (columns: {list(df.columns)})")
    values = pd.to_numeric(df[metric], errors="coerce").to_numpy()
    d = pd.DataFrame({"round": df["round"].to_numpy(), "value": values})
    if "seed" in df.columns:
        d["seed"] = df["seed"].to_numpy()
    d = d.dropna(subset=["value"])
    if "seed" in d.columns:
        dup = d.duplicated(["seed", "round"])
        if dup.any():
            raise DataError(f"curve {label!r}: a (seed, round) pair appears twice")
    elif d["round"].duplicated().any():
        raise DataError(
            f"curve {label!r}: rounds repeat; add a 'seed' column to plot several runs under one label"
        )
    g = d.groupby("round", sort=True)["value"]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0), "n": g.size()}).reset_index()


def plot_curves(
    curves: Mapping[str, pd.DataFrame],
    metric: str,
    path: str | os.PathLike,
    title: str | None = None,
    scale: float = 100.0,
    ylabel: str | None = None,
) -> None:
    """Plot ``metric`` over rounds for every run label and save the figure atomically.

    curves: label -> per-round table (``round``, ``metric``, optional ``seed``).
        A label with several seeds is drawn as the mean with a ± std band.
    metric: the column to plot; values are multiplied by ``scale`` (100 = %).
    path: output file; the format follows its suffix (png, svg, pdf).
    The figure is built on matplotlib's Agg canvas directly (no pyplot state,
    no display needed); files are byte-identical for identical inputs.
    """
    import matplotlib  # lazy: matplotlib only where a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only where a figure is drawn
    from matplotlib.figure import Figure  # lazy: matplotlib only where a figure is drawn

    if not curves:
        raise DataError("plot_curves: no curves given")
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, df in curves.items():
        st = curve_stats(df, metric, str(label))
        if st.empty:
            raise DataError(f"curve {label!r}: no evaluated rounds of {metric!r}")
        x = st["round"].to_numpy()
        y = st["mean"].to_numpy(dtype=np.float64) * scale
        (line,) = ax.plot(x, y, label=str(label), linewidth=1.4)
        if (st["n"] > 1).any():
            s = st["std"].to_numpy(dtype=np.float64) * scale
            ax.fill_between(x, y - s, y + s, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel if ylabel is not None else (f"{metric} (%)" if scale == 100 else metric))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fmt = Path(path).suffix.lstrip(".").lower()
    kwargs = {"metadata": _NO_DATE[fmt]} if fmt in _NO_DATE else {}
    with matplotlib.rc_context({"svg.hashsalt": "fnlcore"}):  # fixed SVG ids instead of random ones
        save_figure(fig, path, **kwargs)
