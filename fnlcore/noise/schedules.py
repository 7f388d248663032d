"""Client-level schedules: which clients are noisy and at what nominal level.

Each function takes the RandomState that the sample-level draws then continue,
exactly as the official ``add_noise`` functions do (schedule first, then the
per-client loop in ascending client id).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .result import ASYM, CLEAN, SYM


@dataclass(frozen=True)
class ClientSchedule:
    """Per-client nominal noise: flag, level and (for FedGR) type."""

    noisy: np.ndarray  # (K,) bool
    level: np.ndarray  # (K,) float64
    kind: tuple[str, ...]  # (K,) noise type strings

    def noisy_clients(self) -> list[int]:
        return [int(k) for k in np.flatnonzero(self.noisy)]


def client_kinds(noisy: np.ndarray, kind: str) -> tuple[str, ...]:
    """``kind`` for noisy clients, ``clean`` for the others."""
    return tuple(kind if f else CLEAN for f in noisy)


def fedcorr_levels(rng: np.random.RandomState, num_clients: int, rho: float, tau: float) -> np.ndarray:
    """FedCorr ``add_noise`` (fedcorr.md §3): level_k = gamma_k * ((1 - tau) * u_k + tau).

    gamma = ``binomial(1, rho, K)`` (random number of noisy clients), u = ``rand(K)``;
    the float expression keeps the official order. A client is noisy iff level > 0.
    """
    gamma = rng.binomial(1, rho, num_clients)
    u = rng.rand(num_clients)
    return gamma * ((1 - tau) * u + tau)


def fednoro_levels(
    rng: np.random.RandomState, num_clients: int, rho: float, eta_l: float, eta_u: float
) -> tuple[np.ndarray, np.ndarray]:
    """FedNoRo ``add_noise`` (fednoro.md §3): exactly int(rho*K) noisy clients.

    gamma = zeros(K); gamma[:int(rho*K)] = 1; shuffle(gamma); u = rand(K);
    eta_k = gamma_k * ((eta_u - eta_l) * u_k + eta_l). Returns (gamma == 1, eta).
    """
    gamma = np.zeros(num_clients, dtype=np.float64)
    gamma[: int(rho * num_clients)] = 1.0
    rng.shuffle(gamma)
    u = rng.rand(num_clients)
    return gamma == 1.0, gamma * ((eta_u - eta_l) * u + eta_l)


def fedncl_bernoulli_noisy(rng: np.random.RandomState, num_clients: int, p_clean: float) -> np.ndarray:
    """Fed-NCL Bernoulli (fedncl.md §3): u = rand(K); client noisy iff u <= 1 - p."""
    u = rng.rand(num_clients)
    return u <= 1 - p_clean


def fedncl_gaussian_levels(
    rng: np.random.RandomState, num_clients: int, mu: float, sigma: float, truncation: str = "clip"
) -> np.ndarray:
    """Fed-NCL truncated Gaussian (fedncl.md §3): per-client flip probability x_k in [0, 1].

    ``truncation="clip"`` (code): x = normal(mu, sigma, K) clipped to [0, 1].
    ``truncation="truncnorm"`` (paper Eq. 5): scipy ``truncnorm`` on [0, 1], drawn
    from the same RandomState; with sigma = 0 it is the constant clip(mu) (no draw).
    """
    if truncation == "clip":
        return np.clip(rng.normal(mu, sigma, num_clients), 0.0, 1.0)
    if sigma == 0:
        return np.full(num_clients, min(max(mu, 0.0), 1.0))
    from scipy.stats import truncnorm  # lazy: scipy only for this draw

    a, b = (0.0 - mu) / sigma, (1.0 - mu) / sigma
    x = truncnorm.rvs(a, b, loc=mu, scale=sigma, size=num_clients, random_state=rng)
    return np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)


def fedgr_schedule(
    rng: np.random.RandomState,
    num_clients: int,
    phi: float,
    rho_min: float,
    rho_max: float,
    noise_type: str,
) -> ClientSchedule:
    """FedGR (fedgr.md §3). The dev code is not retrievable, so this draw order is ours:

    1. ``perm = permutation(K)``; noisy = the first int(K*phi) entries of perm.
    2. mixed only: ``coin = rand(#noisy)`` over noisy clients in ascending id;
       coin < 0.5 -> sym, else asym.
    3. ``rho = uniform(rho_min, rho_max, #noisy)`` over noisy clients in ascending id.
    """
    perm = rng.permutation(num_clients)
    noisy_ids = np.sort(perm[: int(num_clients * phi)])
    if noise_type == "mixed":
        coin = rng.rand(noisy_ids.size)
        types = np.where(coin < 0.5, SYM, ASYM)
    else:
        types = np.full(noisy_ids.size, noise_type)
    rates = rng.uniform(rho_min, rho_max, noisy_ids.size)
    noisy = np.zeros(num_clients, dtype=bool)
    noisy[noisy_ids] = True
    level = np.zeros(num_clients, dtype=np.float64)
    level[noisy_ids] = rates
    kind = [CLEAN] * num_clients
    for k, t in zip(noisy_ids.tolist(), types.tolist()):
        kind[k] = t
    return ClientSchedule(noisy=noisy, level=level, kind=tuple(kind))
