"""FedMLP partial labels (MICCAI'24, fedmlp.md §3): each client annotates only some classes.

For every client, every class it does not annotate is set to 0 for all its
samples ("missing classes are negative"); the per-sample mask of annotated
classes is kept so methods can tell a missing label from a true negative.
"""

from __future__ import annotations

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError
from ..rng import python_rng
from .checks import check_num_classes, multi_labels
from .result import PARTIAL, NoiseResult, make_result

FEDMLP_CLASS_SEED = 1037


def fedmlp_active_classes(
    num_clients: int, num_classes: int, num_missing: int, seed: int = FEDMLP_CLASS_SEED
) -> list[list[int]]:
    """Annotated classes of each client (sorted), FedMLP ``main.py``.

    a = C - num_missing. a == 1: client k annotates class k (needs K == C).
    Otherwise ``r = random.Random(seed)`` (= ``random.seed(seed)``) and for k in
    order ``r.sample(list(range(C)), a)``; 1037 is the official data seed.
    """
    num_classes = check_num_classes(num_classes, minimum=2)
    if isinstance(num_missing, bool) or not isinstance(num_missing, (int, np.integer)):
        raise ConfigError(f"num_missing must be an integer, got {num_missing!r}")
    if not 1 <= num_missing < num_classes:
        raise ConfigError(
            f"num_missing = {num_missing} must be in [1, num_classes - 1 = {num_classes - 1}]: "
            "every client must keep at least one class and miss at least one"
        )
    active = num_classes - int(num_missing)
    if active == 1:
        if num_clients != num_classes:
            raise ConfigError(
                f"num_missing = {num_missing} leaves one class per client, which FedMLP assigns as "
                f"'client k labels class k'; that needs as many clients as classes, got "
                f"{num_clients} clients and {num_classes} classes — use K = {num_classes} or fewer missing classes"
            )
        return [[k] for k in range(num_clients)]
    r = python_rng(seed)
    return [sorted(r.sample(list(range(num_classes)), active)) for _ in range(num_clients)]


def active_mask_from_lists(active: list[list[int]], num_classes: int) -> np.ndarray:
    """(K, C) bool mask from per-client class lists."""
    mask = np.zeros((len(active), num_classes), dtype=bool)
    for k, classes in enumerate(active):
        mask[k, classes] = True
    return mask


def apply_partial_labels(
    labels: np.ndarray, assignment: ClientAssignment, active_mask: np.ndarray, num_classes: int
) -> NoiseResult:
    """Zero every non-annotated class of every client; keep the per-sample annotated mask.

    ``active_mask``: (K, C) bool. Unassigned samples keep their labels and an
    all-ones mask.
    """
    y = multi_labels(labels, num_classes, assignment)
    mask = np.asarray(active_mask, dtype=bool)
    if mask.shape != (assignment.num_clients, num_classes):
        raise ConfigError(
            f"active_mask must have shape (num_clients, num_classes) = "
            f"({assignment.num_clients}, {num_classes}), got {mask.shape}"
        )
    client = assignment.client_of()
    sample_active = np.ones(y.shape, dtype=np.uint8)
    assigned = client >= 0
    sample_active[assigned] = mask[client[assigned]]
    given = y * sample_active
    missing = (~mask).sum(axis=1)
    return make_result(
        "fedmlp_partial",
        y,
        given,
        missing > 0,
        missing / num_classes,
        [PARTIAL if m else "clean" for m in missing],
        active_mask=mask,
        sample_active=sample_active,
    )


def fedmlp_partial_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    num_classes: int,
    num_missing: int,
    seed: int = FEDMLP_CLASS_SEED,
) -> NoiseResult:
    """FedMLP missing classes: :func:`fedmlp_active_classes` then :func:`apply_partial_labels`."""
    active = fedmlp_active_classes(assignment.num_clients, num_classes, num_missing, seed)
    return apply_partial_labels(labels, assignment, active_mask_from_lists(active, num_classes), num_classes)
