"""Per-client summary of a noise result and the true -> given transition counts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..assignment import ClientAssignment
from ..errors import DataError
from .result import NoiseResult


def check_result_matches(result: NoiseResult, labels: np.ndarray, assignment: ClientAssignment) -> np.ndarray:
    """The true labels as an array, after checking they fit ``result`` and ``assignment``."""
    y = np.asarray(labels)
    if y.shape != result.given.shape:
        raise DataError(
            f"labels have shape {y.shape} but the noise result's given labels have {result.given.shape}; "
            "pass the same true labels the noise model was run on"
        )
    if assignment.num_clients != result.num_clients or assignment.num_samples != y.shape[0]:
        raise DataError(
            f"assignment ({assignment.num_clients} clients, {assignment.num_samples} samples) does not match "
            f"the noise result ({result.num_clients} clients, {y.shape[0]} samples); pass the partition "
            "the noise model was run on"
        )
    return y


def _per_client_sum(client: np.ndarray, values: np.ndarray, num_clients: int) -> np.ndarray:
    assigned = client >= 0
    return np.bincount(client[assigned], weights=values[assigned], minlength=num_clients)[:num_clients]


def noise_summary(result: NoiseResult, labels: np.ndarray, assignment: ClientAssignment) -> pd.DataFrame:
    """One row per client: client, n, noisy, noise_type, nominal_level, realized_rate.

    realized_rate = fraction of the client's samples whose given label differs
    from the true one (NaN for an empty client). For partial labels also
    ``active_classes`` (space-separated class indices) and
    ``positives_removed`` (true positives turned into 0).
    """
    y = check_result_matches(result, labels, assignment)
    k = assignment.num_clients
    sizes = assignment.sizes()
    client = assignment.client_of()
    flipped = _per_client_sum(client, result.is_noisy.astype(np.float64), k)
    with np.errstate(invalid="ignore", divide="ignore"):
        realized = np.where(sizes > 0, flipped / np.maximum(sizes, 1), np.nan)
    df = pd.DataFrame(
        {
            "client": np.arange(k, dtype=np.int64),
            "n": sizes.astype(np.int64),
            "noisy": result.client_noisy.astype(bool),
            "noise_type": list(result.client_type),
            "nominal_level": result.client_level.astype(np.float64),
            "realized_rate": realized,
        }
    )
    if result.active_mask is not None:
        df["active_classes"] = [" ".join(str(c) for c in np.flatnonzero(row)) for row in result.active_mask]
        removed = ((y == 1) & (result.given == 0)).sum(axis=1).astype(np.float64)
        df["positives_removed"] = _per_client_sum(client, removed, k).astype(np.int64)
    return df


def transition_counts(result: NoiseResult, labels: np.ndarray, assignment: ClientAssignment, num_classes: int) -> np.ndarray:
    """(C, C) int64 counts of true class (row) -> given class (column) over assigned samples (single-label)."""
    y = check_result_matches(result, labels, assignment)
    if y.ndim != 1:
        raise DataError("transition counts are defined for single-label data only")
    idx = np.concatenate(assignment.clients) if assignment.num_clients else np.zeros(0, np.int64)
    flat = y[idx].astype(np.int64) * num_classes + result.given[idx].astype(np.int64)
    return np.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def row_normalise(counts: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (rows with no samples stay 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
