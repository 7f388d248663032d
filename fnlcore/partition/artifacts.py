"""Partition artifacts: the assignment parquet, per-client class counts, and a FedNoRo Fig. 3-style figure.

Figures use matplotlib's object API (``Figure``) with the Agg canvas, so no
pyplot state or interactive backend is involved.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

from ..assignment import ClientAssignment
from ..errors import DataError
from ..io import read_parquet, rebuild_advice, save_figure, write_csv, write_parquet

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PARTITION_COLUMNS = ("sample_id", "client", "position")


def class_count_frame(
    assignment: ClientAssignment,
    labels: np.ndarray,
    num_classes: int,
    class_names: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per client: ``client``, ``n`` (samples), then one count column per class.

    Single-label ``labels`` (n,) give class counts; multi-label (n, C) 0/1
    matrices give positives per class. Columns are named by ``class_names`` or
    the class index.
    """
    labels = np.asarray(labels)
    if labels.shape[0] != assignment.num_samples:
        raise DataError(
            f"labels have {labels.shape[0]} rows but the partition covers {assignment.num_samples} samples; "
            "pass the labels of the same training split"
        )
    if labels.ndim == 2 and labels.shape[1] != num_classes:
        raise DataError(f"multi-label matrix has {labels.shape[1]} columns but num_classes={num_classes}")
    names = _class_names(num_classes, class_names)
    counts = assignment.class_counts(labels, num_classes)
    columns = {"client": np.arange(assignment.num_clients, dtype=np.int64), "n": assignment.sizes()}
    columns.update({name: counts[:, j] for j, name in enumerate(names)})
    return pd.DataFrame(columns)


def partition_figure(
    counts: np.ndarray,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
    max_columns: int = 120,
    max_rows: int = 100,
) -> Figure:
    """Dots at (client, class) with area proportional to the count (FedNoRo, Figure 3 style).

    ``counts`` is the K x C matrix. Beyond ``max_columns`` clients (``max_rows``
    classes) consecutive clients (classes) are pooled into equal groups, one dot
    per group, so that dots stay large enough to read (K=500 -> groups of 5).
    Tick labels are thinned; class names are shown up to 40 rows.
    """
    counts = np.asarray(counts, dtype=float)
    k, c = counts.shape
    group_k = max(1, -(-k // max_columns))
    group_c = max(1, -(-c // max_rows))
    grid = _pool(counts, group_k, group_c)
    cols, rows = grid.shape
    width = float(np.clip(2.0 + 0.3 * cols, 6.0, 20.0))
    height = float(np.clip(1.6 + 0.3 * rows, 3.0, 14.0))
    # matplotlib here, not with the module: a Snakefile parse imports this module and draws nothing
    from matplotlib.figure import Figure  # lazy: matplotlib only where a figure is drawn
    from matplotlib.ticker import FuncFormatter, MaxNLocator  # lazy: matplotlib only where a figure is drawn

    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    # the largest dot fills ~90% of a grid cell (points; the axes take about the figure minus margins)
    cell = min((width - 1.6) * 72 / cols, (height - 1.2) * 72 / rows)
    max_area = (0.9 * max(cell, 1.0)) ** 2
    top = grid.max() if grid.size and grid.max() > 0 else 1.0
    xs, ys = np.nonzero(grid > 0)
    ax.scatter(xs, ys, s=grid[xs, ys] / top * max_area, c="tab:blue", alpha=0.75, linewidths=0,
               rasterized=xs.size > 20_000)
    ax.set_xlim(-0.6, cols - 0.4)
    ax.set_ylim(-0.6, rows - 0.4)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=min(cols, 25), integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v)) * group_k:d}"))
    ax.set_xlabel("client" if group_k == 1 else f"client (dots pool {group_k} consecutive clients)")
    if class_names is not None and group_c == 1 and rows <= 40:
        ax.set_yticks(range(rows), [str(n) for n in class_names], fontsize="small")
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=min(rows, 20), integer=True))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v)) * group_c:d}"))
    ax.set_ylabel("class" if group_c == 1 else f"class (dots pool {group_c} consecutive classes)")
    ax.grid(True, linewidth=0.3, alpha=0.4)
    ax.set_axisbelow(True)
    for value in _legend_counts(top):
        ax.scatter([], [], s=value / top * max_area, c="tab:blue", alpha=0.75, linewidths=0, label=f"{value:g}")
    ax.legend(title="samples", loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small",
              title_fontsize="small", frameon=False, labelspacing=1.2)
    ax.set_title(title if title is not None else f"{k} clients, {c} classes, {int(counts.sum())} samples")
    return fig


def _pool(counts: np.ndarray, group_k: int, group_c: int) -> np.ndarray:
    """Sum blocks of ``group_k`` consecutive clients x ``group_c`` consecutive classes (zero-padded)."""
    k, c = counts.shape
    padded = np.zeros((-(-k // group_k) * group_k, -(-c // group_c) * group_c))
    padded[:k, :c] = counts
    return padded.reshape(padded.shape[0] // group_k, group_k, padded.shape[1] // group_c, group_c).sum(axis=(1, 3))


def write_partition_artifacts(
    assignment: ClientAssignment,
    labels: np.ndarray,
    num_classes: int,
    parquet_path: str | os.PathLike,
    counts_path: str | os.PathLike,
    figure_path: str | os.PathLike,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    """Write the three artifacts of a partition, each atomically.

    - ``parquet_path``: ``assignment.to_frame()`` (sample_id, client, position, all int64);
      the same assignment always gives the same bytes;
    - ``counts_path``: CSV of :func:`class_count_frame`;
    - ``figure_path``: PNG of :func:`partition_figure`.
    """
    # everything that can fail on bad input happens before the first file is written
    counts = class_count_frame(assignment, labels, num_classes, class_names)
    frame = assignment.to_frame().astype({col: np.int64 for col in PARTITION_COLUMNS})
    names = list(counts.columns[2:])
    fig = partition_figure(counts[names].to_numpy(), class_names=names if class_names is not None else None, title=title)
    write_parquet(frame, parquet_path)
    write_csv(counts, counts_path)
    save_figure(fig, figure_path, dpi=120)


def read_partition(
    parquet_path: str | os.PathLike, num_samples: int, num_clients: int | None = None
) -> ClientAssignment:
    """Load a partition parquet written by :func:`write_partition_artifacts`.

    ``num_clients`` keeps trailing empty clients. Missing columns, positions
    that are not 0..size-1 within a client, or indices outside [0, num_samples)
    raise DataError naming the file.
    """
    if not os.path.exists(parquet_path):
        raise DataError(f"partition file {os.fspath(parquet_path)!r} does not exist; run the partition rule first")
    frame = read_parquet(parquet_path)
    missing = [col for col in PARTITION_COLUMNS if col not in frame.columns]
    if missing:
        raise DataError(
            f"partition file {os.fspath(parquet_path)!r} lacks column(s) {missing}; "
            f"expected {list(PARTITION_COLUMNS)}; {rebuild_advice(parquet_path)}"
        )
    frame = frame.sort_values(["client", "position"], kind="stable")
    client = frame["client"].to_numpy(dtype=np.int64)
    position = frame["position"].to_numpy(dtype=np.int64)
    if client.size:
        starts = np.r_[0, np.flatnonzero(np.diff(client)) + 1]
        expected = np.arange(client.size) - np.repeat(starts, np.diff(np.r_[starts, client.size]))
        if client.min() < 0 or not np.array_equal(position, expected):
            raise DataError(
                f"partition file {os.fspath(parquet_path)!r} is corrupted: negative client ids or positions "
                f"that are not 0..size-1 within a client; {rebuild_advice(parquet_path)}"
            )
        if num_clients is not None and client.max() >= num_clients:
            raise DataError(
                f"partition file {os.fspath(parquet_path)!r} has client {int(client.max())} "
                f"but num_clients={num_clients}"
            )
    try:
        return ClientAssignment.from_frame(frame, num_samples=num_samples, num_clients=num_clients)
    except DataError as err:
        raise DataError(f"partition file {os.fspath(parquet_path)!r}: {err}") from err


def _class_names(num_classes: int, class_names: Sequence[str] | None) -> list[str]:
    if class_names is None:
        return [str(j) for j in range(num_classes)]
    names = [str(n) for n in class_names]
    if len(names) != num_classes:
        raise DataError(f"class_names has {len(names)} entries but num_classes={num_classes}")
    if len(set(names)) != len(names) or {"client", "n"} & set(names):
        raise DataError(f"class_names must be unique and not 'client' or 'n', got {names}")
    return names


def _legend_counts(top: float) -> list[float]:
    """Up to three round reference counts for the size legend."""
    if top <= 0:
        return []
    magnitude = 10 ** np.floor(np.log10(top))
    values = sorted({float(v) for v in (magnitude, magnitude * np.floor(top / magnitude / 2) or magnitude, top)})
    return [v for v in values if v > 0][-3:]


__all__ = ["PARTITION_COLUMNS", "class_count_frame", "partition_figure", "read_partition", "write_partition_artifacts"]
