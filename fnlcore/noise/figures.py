"""Figures of a noise result (matplotlib's object API with the Agg canvas; no pyplot state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: a Snakefile parse needs none
    from matplotlib.figure import Figure


def _tick_labels(num: int, names: Sequence[str] | None) -> list[str]:
    return [str(n) for n in names] if names is not None else [str(i) for i in range(num)]


def plot_noise_rates(summary: pd.DataFrame) -> Figure:
    """Per-client bars of the realised noise rate with the nominal level marked."""
    k = len(summary)
    from matplotlib.figure import Figure  # lazy: matplotlib only where a figure is drawn
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib only where a figure is drawn

    fig = Figure(figsize=(min(2 + 0.25 * k, 16), 3.5), layout="constrained")
    ax = fig.add_subplot()
    x = summary["client"].to_numpy()
    ax.bar(x, summary["realized_rate"].to_numpy(dtype=float), width=0.8, color="tab:blue", label="realised")
    ax.scatter(x, summary["nominal_level"].to_numpy(dtype=float), marker="_", s=80, color="tab:red",
               label="nominal", zorder=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("client")
    ax.set_ylabel("noise rate")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper right", fontsize="small")
    return fig


def plot_transition_matrix(matrix: np.ndarray, class_names: Sequence[str] | None = None) -> Figure:
    """Heatmap of the row-normalised true -> given matrix."""
    c = matrix.shape[0]
    size = min(3 + 0.35 * c, 14)
    from matplotlib.figure import Figure  # lazy: matplotlib only where a figure is drawn

    fig = Figure(figsize=(size, size * 0.85), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
    ax.set_xlabel("given label")
    ax.set_ylabel("true label")
    if c <= 30:
        names = _tick_labels(c, class_names)
        ax.set_xticks(range(c), names, rotation=90, fontsize="small")
        ax.set_yticks(range(c), names, fontsize="small")
        if c <= 12:
            for i in range(c):
                for j in range(c):
                    if matrix[i, j] > 0:
                        ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=7,
                                color="white" if matrix[i, j] < 0.6 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046)
    return fig


def plot_active_mask(mask: np.ndarray, class_names: Sequence[str] | None = None) -> Figure:
    """Clients x classes map of annotated (1) and missing (0) classes (partial labels)."""
    k, c = mask.shape
    from matplotlib.figure import Figure  # lazy: matplotlib only where a figure is drawn

    fig = Figure(figsize=(min(3 + 0.4 * c, 14), min(2 + 0.3 * k, 14)), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(mask.astype(float), vmin=0, vmax=1, cmap="Greens", interpolation="nearest", aspect="auto")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if c <= 30:
        ax.set_xticks(range(c), _tick_labels(c, class_names), rotation=90, fontsize="small")
    if k <= 30:
        ax.set_yticks(range(k), [str(i) for i in range(k)], fontsize="small")
    ax.set_title("annotated classes per client")
    return fig
