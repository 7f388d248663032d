"""FedNoRo's heterogeneous instance-dependent noise, H-IDN (fednoro.md §3).

Soft labels (class probabilities per training sample) come from annotator
networks (paper Alg. 1) or from the official ``ICH_softlabel.csv``; this module
only consumes the (n, C) array.
"""

from __future__ import annotations

import numpy as np

from ..assignment import ClientAssignment
from ..errors import DataError
from ..io import read_npz, rebuild_advice
from ..rng import legacy_rng
from . import flips, schedules
from .checks import single_labels
from .result import CLEAN, HIDN, NoiseResult, make_result

# Added to every misclassification weight of a client whose weights have fewer
# non-zero entries than the number of samples to draw (saturated annotators).
WEIGHT_EPS = 1e-12


def fednoro_noisy_clients(num_clients: int, rho: float, seed: int) -> list[int]:
    """The int(rho*K) noisy clients of FedNoRo's schedule, ascending; cheap (no labels needed).

    Used when building the workflow DAG to decide which clients need an
    annotator network. Agrees with :func:`hidn_noise` for the same seed (it
    replays the same first draws: the shuffle of the 0/1 vector).
    """
    gamma = np.zeros(num_clients, dtype=np.float64)
    gamma[: int(rho * num_clients)] = 1.0
    legacy_rng(seed).shuffle(gamma)
    return [int(k) for k in np.flatnonzero(gamma == 1.0)]


def _client_soft(soft: np.ndarray, idx: np.ndarray, client: int) -> np.ndarray:
    s = np.asarray(soft[idx], dtype=np.float64)  # official: .astype("float"); a copy
    if not np.isfinite(s).all():
        raise DataError(
            f"soft_labels has NaN/inf in rows of noisy client {client}; the annotator output for this "
            "client is missing or broken — rerun its annotator or check the soft-label file"
        )
    if (s < 0).any():
        raise DataError(f"soft_labels has negative probabilities in rows of noisy client {client}")
    return s


def misclassification_weights(p_true: np.ndarray, count: int) -> np.ndarray:
    """p~ = (1 - p_t) / sum, FedNoRo Eq. (1).

    Guards, applied only when needed so the official case is bit-identical:
    negative entries (p_t > 1 by rounding) are clipped to 0; if fewer than
    ``count`` entries are non-zero (numpy would refuse to draw), 1e-12 is
    added to every entry before normalising.
    """
    w = 1 - p_true
    if (w < 0).any():
        w = np.maximum(w, 0.0)
    if np.count_nonzero(w > 0) < count:
        w = w + WEIGHT_EPS
    return w / w.sum()


def draw_other_labels(rng: np.random.RandomState, soft_rows: np.ndarray, true: np.ndarray) -> np.ndarray:
    """One ``choice(C, p=q_j)`` per row in order, vectorised; q_j = soft row with the true class zeroed, renormalised.

    Consumes one uniform per row (``random_sample(M)`` equals M successive
    scalar draws) and inverts each row's CDF as numpy's ``choice`` does
    (cumsum, divide by the last entry, ``searchsorted(side="right")``), so the
    labels equal the official per-sample loop. Guard: a row with no mass
    outside the true class is drawn uniformly over the other classes with the
    same uniform. The result never equals the true class.
    """
    m, c = soft_rows.shape
    q = soft_rows.copy()
    rows = np.arange(m)
    q[rows, true] = 0.0
    total = q.sum(axis=1)
    empty = total == 0
    if empty.any():
        q[empty] = 1.0
        q[rows[empty], true[empty]] = 0.0
        total = q.sum(axis=1)
    q /= total[:, None]
    u = rng.random_sample(m)
    cdf = np.cumsum(q, axis=1)
    cdf /= cdf[:, -1:]
    return np.count_nonzero(cdf <= u[:, None], axis=1).astype(np.int64)


def hidn_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    rho: float,
    eta_l: float,
    eta_u: float,
    soft_labels: np.ndarray,
    seed: int,
    num_classes: int,
) -> NoiseResult:
    """FedNoRo H-IDN (IJCAI'23, fednoro.md §3; official ``add_noise`` with ``n_type="instance"``).

    Schedule :func:`schedules.fednoro_levels` (exactly int(rho*K) noisy clients,
    eta_k ~ U(eta_l, eta_u)). Then for each noisy client in ascending id, J = its
    samples in the client's order: p_t = soft[j, y_j]; M_k = int(eta_k * N_k)
    positions by numpy's legacy weighted sampling without replacement with
    weights 1 - p_t; each chosen sample, in drawn order, gets a label drawn from
    its soft row with the true class removed (always a different class).

    ``soft_labels``: (n, C) class probabilities; only rows of noisy clients'
    samples are read (others may be NaN). Clients with M_k = 0 draw nothing
    (the official call with size 0 draws nothing either).
    """
    y = single_labels(labels, num_classes, assignment)
    soft = np.asarray(soft_labels)
    if soft.ndim != 2 or soft.shape != (y.shape[0], num_classes):
        raise DataError(
            f"soft_labels must have shape (n, num_classes) = ({y.shape[0]}, {num_classes}), got {soft.shape}; "
            "give one probability row per training sample, columns in class order"
        )
    rng = legacy_rng(seed)
    noisy, level = schedules.fednoro_levels(rng, assignment.num_clients, rho, eta_l, eta_u)
    given = y.copy()
    for k in np.flatnonzero(noisy):
        idx = assignment.clients[k]
        m = flips.exact_count(idx.size, level[k])
        if m == 0:
            continue
        s = _client_soft(soft, idx, int(k))
        yk = y[idx]
        p_true = s[np.arange(idx.size), yk]
        pos = flips.select_weighted(rng, misclassification_weights(p_true, m), m)
        given[idx[pos]] = draw_other_labels(rng, s[pos], yk[pos])
    kinds = tuple(HIDN if f else CLEAN for f in noisy)
    return make_result("fednoro_hidn", y, given, noisy, level, kinds)


def assemble_soft_labels(probs_files: list[str], num_samples: int, num_classes: int) -> np.ndarray:
    """Stack the annotators' per-client probabilities into one (n, C) table (NaN elsewhere)."""
    soft = np.full((num_samples, num_classes), np.nan, dtype=np.float64)
    for f in probs_files:
        z = read_npz(f, ("sample_id", "probs"))
        try:
            soft[z["sample_id"]] = z["probs"]
        except (IndexError, ValueError) as err:  # another set's or class count's probabilities
            raise DataError(f"{f}: its probabilities do not fit {num_samples} samples x {num_classes} classes "
                            f"({err}): {rebuild_advice(f)}") from None
    return soft
