"""The outcome of a noise model: given labels plus the per-client nominal settings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Noise type strings used in NoiseResult.client_type and in the summary CSV.
CLEAN = "clean"
SYM_INCL = "sym_incl"  # uniform over a label space that includes the true class
SYM = "sym"  # uniform over the other C-1 classes
ASYM = "asym"  # deterministic class map
HIDN = "hidn"  # instance-dependent (FedNoRo H-IDN)
PARTIAL = "partial"  # FedMLP missing classes (multi-label)


@dataclass(frozen=True, eq=False)
class NoiseResult:
    """Given (possibly corrupted) labels and what each client was nominally assigned.

    Attributes:
        model: config name of the noise model that produced it.
        given: labels as the clients see them; same shape and dtype as the true
            labels (1-D int64, or (n, C) uint8 for multi-label).
        is_noisy: (n,) bool; single-label: given != true; multi-label: any entry
            changed. False for samples that belong to no client.
        client_noisy: (K,) bool, the nominal noisy flag of each client.
        client_level: (K,) float64, the nominal noise level of each client
            (0 for clean clients; for partial labels the fraction of missing classes).
        client_type: K noise type strings (``clean``, ``sym``, ``sym_incl``,
            ``asym``, ``hidn``, ``partial``).
        active_mask: partial labels only: (K, C) bool, class c is annotated by client k.
        sample_active: partial labels only: (n, C) uint8 per-sample mask of the
            classes its client annotates (all ones for unassigned samples).
    """

    model: str
    given: np.ndarray
    is_noisy: np.ndarray
    client_noisy: np.ndarray
    client_level: np.ndarray
    client_type: tuple[str, ...]
    active_mask: np.ndarray | None = None
    sample_active: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return int(self.client_noisy.shape[0])

    @property
    def multi_label(self) -> bool:
        return self.given.ndim == 2

    def noisy_clients(self) -> list[int]:
        """Ascending ids of the nominally noisy clients."""
        return [int(k) for k in np.flatnonzero(self.client_noisy)]


def changed_samples(true: np.ndarray, given: np.ndarray) -> np.ndarray:
    """Per-sample flag: the given label differs from the true one (any entry, for multi-label)."""
    diff = np.asarray(true) != np.asarray(given)
    return diff.any(axis=1) if diff.ndim == 2 else diff


def make_result(
    model: str,
    true: np.ndarray,
    given: np.ndarray,
    client_noisy: np.ndarray,
    client_level: np.ndarray,
    client_type: tuple[str, ...] | list[str],
    active_mask: np.ndarray | None = None,
    sample_active: np.ndarray | None = None,
) -> NoiseResult:
    """Assemble a NoiseResult, deriving ``is_noisy`` from the two label arrays."""
    return NoiseResult(
        model=model,
        given=given,
        is_noisy=changed_samples(true, given),
        client_noisy=np.asarray(client_noisy, dtype=bool),
        client_level=np.asarray(client_level, dtype=np.float64),
        client_type=tuple(str(t) for t in client_type),
        active_mask=None if active_mask is None else np.asarray(active_mask, dtype=bool),
        sample_active=sample_active,
    )
