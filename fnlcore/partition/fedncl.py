"""Fed-NCL's quantity-skew split (``utils/sampling.py::unbalance_iid`` of the Fed-NCL code).

The official function never seeds; by the project's convention our ``seed``
stands for ``np.random.seed(seed)`` right before the call. Draw order (as in
the code): one ``lognormal(mean=ln(int(n/K)), sigma, size=K)`` call, then for
clients 0..K-1 ``choice(pool, size_k, replace=False)`` (a full
``permutation(len(pool))`` each, even for size 0) and ``pool = list(set(pool) - set(chosen))``.
Clients keep the order ``choice`` returned (``list(np.random.choice(...))``).
"""

from __future__ import annotations

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError
from ..rng import legacy_rng
from ._checks import check_clients, check_float, check_num_samples, check_seed
from .setorder import draw_from_pool


def lognormal_sizes(num_samples: int, num_clients: int, sigma: float, rng: np.random.RandomState) -> np.ndarray:
    """Client sizes of ``unbalance_iid`` (same as FedLab's ``lognormal_unbalance_partition``).

    s ~ LogNormal(ln(int(n/K)), sigma) (K draws); s <- floor(s / sum(s) * n); the
    difference ``diff = sum(s) - n`` is subtracted from the first client whose
    size exceeds ``diff`` (diff <= 0, so client 0 receives the shortfall).
    """
    mean_size = int(num_samples / num_clients)
    sizes = rng.lognormal(mean=np.log(mean_size), sigma=sigma, size=num_clients)
    with np.errstate(over="ignore", invalid="ignore"):  # huge sigma: caught by the caller's check
        sizes = (sizes / np.sum(sizes) * num_samples).astype(int)
    diff = int(np.sum(sizes)) - num_samples
    if diff != 0:
        for client in range(num_clients):
            if sizes[client] > diff:
                sizes[client] -= diff
                break
    return sizes.astype(np.int64)


def quantity_skew_lognormal(num_samples: int, num_clients: int, sigma: float, seed: int) -> ClientAssignment:
    """IID samples, log-normal client sizes: Fed-NCL's ``unbalance_iid`` (Table II, Table IV S3/S4).

    Paper: Fed-NCL (Tam et al.), "standard deviation of sample size 0.3", N=20.
    Every sample is assigned (sizes sum to n). ``sigma=0`` gives (almost) equal
    sizes, the rounding shortfall going to client 0.

    Parameters
    ----------
    num_samples: n. num_clients: K (at most n). sigma: log-normal sigma, >= 0.
    seed: as ``np.random.seed(seed)`` right before the (unseeded) official call.
    """
    where = "quantity_skew_lognormal"
    n = check_num_samples(where, num_samples)
    k = check_clients(where, num_clients, n)
    sigma = check_float(where, "sigma", sigma, 0.0, None, hint="log-normal sigma of the client sizes")
    rng = legacy_rng(check_seed(where, seed))
    sizes = lognormal_sizes(n, k, sigma, rng)
    if sizes.min() < 0 or sizes.sum() != n:  # only when sigma is so large that the draws overflow
        raise ConfigError(f"{where}: sigma={sigma} is too large (log-normal sizes overflow); use a smaller sigma")
    clients = draw_from_pool(n, sizes.tolist(), rng, client_order="draw")
    return ClientAssignment(num_samples=n, clients=tuple(clients))


__all__ = ["lognormal_sizes", "quantity_skew_lognormal"]
