"""Asymmetric (class-pair) noise maps: class c is corrupted to ``mapping[c]``.

Named maps:

* ``cifar10_classic`` (alias ``classic``) — Patrini et al. 2017 / Co-teaching /
  DivideMix convention on CIFAR-10: truck 9->1 automobile, bird 2->0 airplane,
  deer 4->7 horse, cat 3->5 dog, dog 5->3 cat; classes 0, 1, 6, 7, 8 unchanged
  (so a "corrupted" sample of those classes keeps its label). Needs C = 10.
* ``cyclic`` — c -> (c + 1) mod C, FedGR dev-code default for CIFAR-10
  (fedgr.md §3); every corrupted sample changes label.
* ``next_in_group`` (alias ``group``) — groups of 5 consecutive indices
  {5g..5g+4}, c -> next in its group, last -> first; the usual CIFAR-100
  convention (FedGR dev code). Needs C divisible by 5.
* an explicit list of C target classes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ConfigError
from ..slugs import short_hash

GROUP_SIZE = 5

# Canonical names and the short form each one takes in a slug.
MAP_NAMES: dict[str, str] = {"cifar10_classic": "classic", "cyclic": "cyclic", "next_in_group": "group"}
MAP_ALIASES: dict[str, str] = {"classic": "cifar10_classic", "group": "next_in_group"}


def cifar10_classic_map(num_classes: int = 10) -> np.ndarray:
    """The field-standard CIFAR-10 pair map (9->1, 2->0, 4->7, 3->5, 5->3)."""
    if num_classes != 10:
        raise ConfigError(
            f"asym_map 'cifar10_classic' is defined for 10 classes, the dataset has {num_classes}; "
            "use 'cyclic', 'next_in_group' or an explicit list"
        )
    m = np.arange(10, dtype=np.int64)
    m[[9, 2, 4, 3, 5]] = [1, 0, 7, 5, 3]
    return m


def cyclic_map(num_classes: int) -> np.ndarray:
    """c -> (c + 1) mod C."""
    return (np.arange(num_classes, dtype=np.int64) + 1) % num_classes


def next_in_group_map(num_classes: int, group_size: int = GROUP_SIZE) -> np.ndarray:
    """Within groups of ``group_size`` consecutive classes: c -> next, last -> first."""
    if num_classes % group_size:
        raise ConfigError(
            f"asym_map 'next_in_group' needs a class count divisible by {group_size}, "
            f"the dataset has {num_classes}; use 'cyclic' or an explicit list"
        )
    c = np.arange(num_classes, dtype=np.int64)
    return (c // group_size) * group_size + (c % group_size + 1) % group_size


def canonical_map(value: str | Sequence[int], key: str = "asym_map") -> str | tuple[int, ...]:
    """Normalise a config value: a known name (aliases resolved) or a tuple of ints.

    Only checks what can be checked without the class count; see :func:`resolve_map`.
    """
    if isinstance(value, str):
        name = MAP_ALIASES.get(value, value)
        if name not in MAP_NAMES:
            valid = sorted(MAP_NAMES) + sorted(MAP_ALIASES)
            raise ConfigError(f"{key} = {value!r} is not a known map; use one of {valid} or a list of classes")
        return name
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if not items:
            raise ConfigError(f"{key}: an explicit map must list one target class per class, got []")
        bad = [v for v in items if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0]
        if bad:
            raise ConfigError(f"{key}: an explicit map must hold non-negative class indices, got {bad[:5]}")
        return tuple(int(v) for v in items)
    raise ConfigError(f"{key} must be a map name or a list of class indices, got {type(value).__name__}")


def resolve_map(value: str | Sequence[int], num_classes: int, key: str = "asym_map") -> np.ndarray:
    """The int64 array of length C for a map name or explicit list; ConfigError if it does not fit."""
    value = canonical_map(value, key)
    if value == "cifar10_classic":
        return cifar10_classic_map(num_classes)
    if value == "cyclic":
        return cyclic_map(num_classes)
    if value == "next_in_group":
        return next_in_group_map(num_classes)
    return validate_map(np.asarray(value, dtype=np.int64), num_classes, key)


def validate_map(mapping: np.ndarray, num_classes: int, key: str = "asym_map") -> np.ndarray:
    """Check an explicit map: length C, every target in [0, C)."""
    mapping = np.asarray(mapping)
    if mapping.ndim != 1 or mapping.shape[0] != num_classes:
        raise ConfigError(
            f"{key} has {mapping.size} entries but the dataset has {num_classes} classes; "
            "give exactly one target class per class"
        )
    if mapping.size and (mapping.min() < 0 or mapping.max() >= num_classes):
        raise ConfigError(f"{key}: targets must lie in [0, {num_classes}), got {mapping.tolist()}")
    return mapping.astype(np.int64)


def map_slug(value: str | tuple[int, ...]) -> str:
    """Short slug piece: 'classic', 'cyclic', 'group' or 'map' + hash of an explicit list."""

    if isinstance(value, str):
        return MAP_NAMES[value]
    return "map" + short_hash(list(value))
