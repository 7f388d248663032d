"""Validation of the inputs every noise model shares (labels, partition, class count).

Data problems raise DataError, setting problems ConfigError; each message names
the argument, what is wrong and how to fix it.
"""

from __future__ import annotations

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError, DataError


def check_num_classes(num_classes: int, minimum: int = 1) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise ConfigError(f"num_classes must be an integer, got {num_classes!r}")
    if num_classes < minimum:
        raise ConfigError(f"num_classes = {num_classes} must be at least {minimum}")
    return int(num_classes)


def _check_assignment(assignment: ClientAssignment, n: int) -> None:
    if not isinstance(assignment, ClientAssignment):
        raise DataError(
            f"assignment must be a fnlcore.assignment.ClientAssignment, got {type(assignment).__name__}"
        )
    if assignment.num_samples != n:
        raise DataError(
            f"assignment covers {assignment.num_samples} samples but labels has {n}: the partition "
            "was built for another dataset or split; rebuild the partition for these labels"
        )


def single_labels(labels: np.ndarray, num_classes: int, assignment: ClientAssignment) -> np.ndarray:
    """Return ``labels`` as int64 after checking shape, dtype, range and the partition size."""
    num_classes = check_num_classes(num_classes)
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise DataError(
            f"labels must be a 1-D array of class indices for this noise model, got shape {arr.shape}; "
            "multi-label (n, C) matrices only work with 'fedmlp_partial' and 'clean'"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"labels must have an integer dtype, got {arr.dtype}; pass class indices")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
        raise DataError(
            f"labels must lie in [0, num_classes={num_classes}); found min {arr.min()}, max {arr.max()}; "
            "pass the dataset's class count as num_classes"
        )
    _check_assignment(assignment, arr.shape[0])
    return arr


def multi_labels(labels: np.ndarray, num_classes: int, assignment: ClientAssignment) -> np.ndarray:
    """Return ``labels`` as a uint8 (n, C) 0/1 matrix after checking shape and values."""
    num_classes = check_num_classes(num_classes)
    arr = np.asarray(labels)
    if arr.ndim != 2 or arr.shape[1] != num_classes:
        raise DataError(
            f"labels must be an (n, num_classes={num_classes}) 0/1 matrix for multi-label noise, "
            f"got shape {arr.shape}"
        )
    if arr.size:
        integral = np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool
        if (arr.min() < 0 or arr.max() > 1) if integral else not np.isin(arr, (0, 1)).all():
            raise DataError("labels of a multi-label dataset must contain only 0 and 1")
    arr = arr.astype(np.uint8, copy=False)
    _check_assignment(assignment, arr.shape[0])
    return arr


def any_labels(labels: np.ndarray, num_classes: int, assignment: ClientAssignment) -> np.ndarray:
    """Single- or multi-label, decided by the number of dimensions."""
    if np.ndim(labels) == 2:
        return multi_labels(labels, num_classes, assignment)
    return single_labels(labels, num_classes, assignment)
