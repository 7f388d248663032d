"""Noise artifacts: the per-sample parquet, the per-client summary CSV and two figures.

All files are written atomically (fnlcore.io); the same result gives a
byte-identical parquet.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from ..assignment import ClientAssignment
from ..errors import DataError
from ..io import read_parquet, save_figure, write_csv, write_parquet
from .figures import plot_active_mask, plot_noise_rates, plot_transition_matrix
from .result import NoiseResult
from .summary import check_result_matches, noise_summary, row_normalise, transition_counts

def noise_frame(result: NoiseResult, labels: np.ndarray, assignment: ClientAssignment) -> pd.DataFrame:
    """Rows for every assigned sample, ordered by client then position.

    Single-label: sample_id, client, position, label_true, label_given, is_noisy.
    Multi-label: sample_id, client, position, true_<c>, given_<c>, active_<c>
    (uint8, c = class index), is_noisy.
    """
    y = check_result_matches(result, labels, assignment)
    df = assignment.to_frame()
    sid = df["sample_id"].to_numpy()
    if y.ndim == 1:
        df["label_true"] = y[sid].astype(np.int64)
        df["label_given"] = result.given[sid].astype(np.int64)
    else:
        c = y.shape[1]
        active = result.sample_active if result.sample_active is not None else np.ones_like(y, dtype=np.uint8)
        cols = {}
        for prefix, arr in (("true", y), ("given", result.given), ("active", active)):
            block = np.ascontiguousarray(arr[sid].astype(np.uint8))
            for j in range(c):
                cols[f"{prefix}_{j}"] = block[:, j]
        df = pd.concat([df, pd.DataFrame(cols, index=df.index)], axis=1)
    df["is_noisy"] = result.is_noisy[sid].astype(bool)
    return df


def write_noise_artifacts(
    result: NoiseResult,
    labels: np.ndarray,
    assignment: ClientAssignment,
    num_classes: int,
    parquet_path: str | os.PathLike,
    summary_path: str | os.PathLike,
    rates_figure_path: str | os.PathLike,
    matrix_figure_path: str | os.PathLike,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> pd.DataFrame:
    """Write the parquet, the summary CSV, the rates figure and the matrix figure; return the summary.

    Both figures carry ``title`` (default: the noise model's name) so that a figure
    found on its own says which label set it shows.

    The matrix figure is the row-normalised true -> given heatmap (single-label)
    or the clients x classes annotated-class mask (partial labels; an all-ones
    mask for clean multi-label data).
    """
    if class_names is not None and len(class_names) != num_classes:
        raise DataError(f"class_names has {len(class_names)} entries but num_classes is {num_classes}")
    frame = noise_frame(result, labels, assignment)
    summary = noise_summary(result, labels, assignment)
    title = title or f"noise model {result.model}"
    rates_fig = plot_noise_rates(summary)
    rates_fig.suptitle(title, fontsize=9)
    if result.multi_label:
        mask = result.active_mask
        if mask is None:
            mask = np.ones((assignment.num_clients, num_classes), dtype=bool)
        matrix_fig = plot_active_mask(mask, class_names)
    else:
        counts = transition_counts(result, labels, assignment, num_classes)
        matrix_fig = plot_transition_matrix(row_normalise(counts), class_names)
    matrix_fig.suptitle(title, fontsize=9)
    write_parquet(frame, parquet_path)
    write_csv(summary, summary_path)
    save_figure(rates_fig, rates_figure_path, dpi=120)
    save_figure(matrix_fig, matrix_figure_path, dpi=120)
    return summary


@dataclass(frozen=True, eq=False)
class NoiseTable:
    """Arrays read back from a noise parquet, one entry per assigned sample (client, position order).

    ``true``/``given``: (m,) int64 or (m, C) uint8; ``active``: (m, C) uint8 for multi-label, else None.
    """

    sample_id: np.ndarray
    client: np.ndarray
    position: np.ndarray
    true: np.ndarray
    given: np.ndarray
    is_noisy: np.ndarray
    active: np.ndarray | None

    @property
    def multi_label(self) -> bool:
        return self.given.ndim == 2

    def given_by_sample(self, num_samples: int, fill: int = -1) -> np.ndarray:
        """Given labels indexed by sample id; unassigned samples get ``fill``."""
        shape = (num_samples,) + self.given.shape[1:]
        out = np.full(shape, fill, dtype=np.int64 if self.given.ndim == 1 else np.int16)
        out[self.sample_id] = self.given
        return out

    def assignment(self, num_samples: int, num_clients: int | None = None) -> ClientAssignment:
        frame = pd.DataFrame({"sample_id": self.sample_id, "client": self.client, "position": self.position})
        return ClientAssignment.from_frame(frame, num_samples, num_clients)


def _block(df: pd.DataFrame, prefix: str, num_classes: int) -> np.ndarray:
    return df[[f"{prefix}_{c}" for c in range(num_classes)]].to_numpy(dtype=np.uint8)


def read_noise(parquet_path: str | os.PathLike) -> NoiseTable:
    """Read a parquet written by :func:`write_noise_artifacts`."""
    df = read_parquet(parquet_path)
    base = ["sample_id", "client", "position", "is_noisy"]
    missing = [c for c in base if c not in df.columns]
    if missing:
        raise DataError(f"{parquet_path}: not a noise parquet, missing columns {missing}; regenerate it")
    common = dict(
        sample_id=df["sample_id"].to_numpy(dtype=np.int64),
        client=df["client"].to_numpy(dtype=np.int64),
        position=df["position"].to_numpy(dtype=np.int64),
        is_noisy=df["is_noisy"].to_numpy(dtype=bool),
    )
    if "label_true" in df.columns and "label_given" in df.columns:
        return NoiseTable(
            true=df["label_true"].to_numpy(dtype=np.int64),
            given=df["label_given"].to_numpy(dtype=np.int64),
            active=None,
            **common,
        )
    num_classes = sum(1 for c in df.columns if c.startswith("true_"))
    expected = [f"{p}_{c}" for p in ("true", "given", "active") for c in range(num_classes)]
    if num_classes == 0 or any(c not in df.columns for c in expected):
        raise DataError(
            f"{parquet_path}: neither label_true/label_given nor complete true_<c>/given_<c>/active_<c> "
            "columns; regenerate the file"
        )
    return NoiseTable(
        true=_block(df, "true", num_classes),
        given=_block(df, "given", num_classes),
        active=_block(df, "active", num_classes),
        **common,
    )
