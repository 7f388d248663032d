"""Parameter checks shared by the partitioners: every failure is a ConfigError that
names the function (or config entry), the parameter, the problem and the fix."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ConfigError

_MAX_SEED = 2**32 - 1  # legacy np.random.seed accepts [0, 2**32 - 1]


def check_int(where: str, name: str, value: Any, minimum: int | None = None, hint: str = "") -> int:
    """``value`` as a Python int (numpy ints accepted, bools and floats refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{where}: {name}={value!r} must be an integer{_hint(hint)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: {name}={value} must be >= {minimum}{_hint(hint)}")
    return value


def check_float(
    where: str,
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a finite float within [low, high] (or (low, high] when ``low_open``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{where}: {name}={value!r} must be a number{_hint(hint)}")
    value = float(value)
    interval = f"{'(' if low_open else '['}{'-inf' if low is None else _num(low)}, {'inf' if high is None else _num(high)}]"
    bad_low = low is not None and (value <= low if low_open else value < low)
    if not math.isfinite(value) or bad_low or (high is not None and value > high):
        raise ConfigError(f"{where}: {name}={_num(value)} must be in {interval}{_hint(hint)}")
    return value


def check_seed(where: str, seed: Any) -> int:
    seed = check_int(where, "seed", seed, minimum=0, hint="np.random.seed accepts 0 .. 2**32 - 1")
    if seed > _MAX_SEED:
        raise ConfigError(f"{where}: seed={seed} must be <= 2**32 - 1 (np.random.seed's range)")
    return seed


def check_clients(where: str, num_clients: Any, num_samples: int) -> int:
    k = check_int(where, "num_clients", num_clients, minimum=1, hint="a partition needs at least one client")
    if k > num_samples:
        raise ConfigError(
            f"{where}: num_clients={k} is more than the {num_samples} samples; use at most {num_samples} clients"
        )
    return k


def check_num_samples(where: str, num_samples: Any) -> int:
    return check_int(where, "num_samples", num_samples, minimum=1, hint="the training split must not be empty")


def single_labels(where: str, labels: Any, num_classes: Any = None) -> tuple[np.ndarray, int]:
    """1-D non-negative integer labels as int64, and the class count C.

    ``num_classes`` defaults to ``max(labels) + 1``; when given, every label must be < C.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ConfigError(
            f"{where}: labels must be a 1-D vector of class indices, got shape {arr.shape}; "
            "for one-hot/multi-label matrices pass labels.argmax(axis=1) or use a label-free partitioner"
        )
    if arr.size == 0:
        raise ConfigError(f"{where}: labels is empty; the training split must have at least one sample")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ConfigError(f"{where}: labels must be integer class indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    lo = int(arr.min())
    if lo < 0:
        raise ConfigError(f"{where}: labels must be >= 0, found {lo}; map classes to 0 .. C-1 first")
    top = int(arr.max())
    if num_classes is None:
        return arr, top + 1
    c = check_int(where, "num_classes", num_classes, minimum=1)
    if top >= c:
        raise ConfigError(
            f"{where}: a label equals {top} but num_classes={c}; labels must be < num_classes "
            "(raise num_classes or leave it unset to use max(labels) + 1)"
        )
    return arr, c


def num_samples_of(where: str, labels: Any) -> int:
    """Row count of a label vector (n,) or multi-label matrix (n, C), for label-free partitioners."""
    arr = np.asarray(labels)
    if arr.ndim not in (1, 2):
        raise ConfigError(f"{where}: labels must have shape (n,) or (n, C), got {arr.shape}")
    if arr.shape[0] == 0:
        raise ConfigError(f"{where}: labels is empty; the training split must have at least one sample")
    return int(arr.shape[0])


def _num(x: float) -> str:
    return repr(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _hint(hint: str) -> str:
    return f" ({hint})" if hint else ""
