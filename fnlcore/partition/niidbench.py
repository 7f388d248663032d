"""NIID-Bench (Li et al. 2022) partitions as implemented by FedLab
(``fedlab/utils/dataset/functional.py``), used by FedGR, and by NIID-Bench's
own ``partition_data`` where the two differ (the IID remainder).

Seed convention: the official code never seeds inside; ``seed`` stands for
``np.random.seed(seed)`` right before the call.
"""

from __future__ import annotations

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError
from ..rng import legacy_rng
from ._checks import check_clients, check_float, check_int, check_num_samples, check_seed, single_labels


IID_REMAINDERS = ("drop", "array_split")


def iid_niidbench(num_samples: int, num_clients: int, seed: int, remainder: str = "drop") -> ClientAssignment:
    """Balanced IID: one ``permutation(n)`` cut into K consecutive parts, client order = permutation order.

    The two official codes share the draw and differ in the n mod K left-over samples:
    - ``remainder="drop"`` (FedLab ``balance_split`` + ``homo_partition``, which
      FedGR's code calls): every client gets ``int(n/K)``; the last n mod K
      samples of the permutation belong to no client.
    - ``remainder="array_split"`` (NIID-Bench ``partition_data`` 'homo':
      ``np.array_split(permutation, K)``): every sample is assigned, the first
      n mod K clients get one more.
    """
    where = "iid_niidbench"
    n = check_num_samples(where, num_samples)
    k = check_clients(where, num_clients, n)
    if remainder not in IID_REMAINDERS:
        raise ConfigError(f"{where}: remainder={remainder!r}; choose one of {', '.join(map(repr, IID_REMAINDERS))}")
    rng = legacy_rng(check_seed(where, seed))
    perm = rng.permutation(n)
    if remainder == "array_split":
        return ClientAssignment(num_samples=n, clients=tuple(np.array_split(perm, k)))
    per_client = int(n / k)
    return ClientAssignment(num_samples=n, clients=tuple(np.split(perm[: per_client * k], k)))


def dirichlet_niidbench(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    min_require_size: int = 10,
    num_classes: int | None = None,
    max_attempts: int = 1000,
) -> ClientAssignment:
    """Hetero-Dirichlet split, FedLab ``hetero_dir_partition`` (NIID-Bench "noniid-labeldir").

    Paper: FedGR (Dir(0.3), K=100 CIFAR / 500 Clothing1M); method from NIID-Bench.
    Repeat until every client holds >= ``min_require_size`` samples: for each
    class k: ``shuffle(idx_k)``; ``proportions = dirichlet(repeat(alpha, K))``;
    zero the share of clients already holding >= n/K samples; renormalise; split
    idx_k at ``(cumsum(proportions) * len(idx_k)).astype(int)[:-1]`` and append.
    Then ``shuffle`` each client's list (clients 0..K-1). A class with no
    samples still takes its shuffle and Dirichlet draws and gives nothing (the
    official code runs there too, even when every client already holds n/K).

    Parameters
    ----------
    labels: (n,) non-negative int class indices.
    num_clients: K. alpha: Dirichlet concentration (> 0).
    seed: as ``np.random.seed(seed)`` right before the official call.
    min_require_size: minimum client size (FedGR/NIID-Bench: 10; FedLab's
        default ``None`` means num_classes). 0 means no minimum: one pass (the
        official ``while`` loop would not run at all and then crash).
    num_classes: C, classes looped over; defaults to ``max(labels) + 1``.
    max_attempts: full re-partitions tried before a ConfigError (the official
        loop would spin forever when the minimum cannot be met).
    """
    where = "dirichlet_niidbench"
    y, c_total = single_labels(where, labels, num_classes)
    n = y.size
    k = check_clients(where, num_clients, n)
    alpha = check_float(where, "alpha", alpha, 0.0, None, low_open=True, hint="Dirichlet concentration")
    min_size = check_int(where, "min_require_size", min_require_size, minimum=0)
    attempts = check_int(where, "max_attempts", max_attempts, minimum=1)
    if min_size * k > n:
        raise ConfigError(
            f"{where}: min_require_size={min_size} x num_clients={k} exceeds the {n} samples; "
            "lower min_require_size or num_clients"
        )
    rng = legacy_rng(check_seed(where, seed))
    class_members = [np.flatnonzero(y == c) for c in range(c_total)]
    cap = n / k  # clients at or above n/K get no more samples (float comparison, as in FedLab)

    for _ in range(attempts):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        sizes = np.zeros(k, dtype=np.int64)
        for c, idx_k in enumerate(class_members):
            idx_k = idx_k.copy()
            rng.shuffle(idx_k)
            proportions = rng.dirichlet(np.repeat(alpha, k))
            if len(idx_k) == 0:
                # a class without samples gives nobody anything (once every client holds n/K
                # the official code divides 0 by 0 here, then splits an empty array)
                continue
            proportions = proportions * (sizes < cap)
            total = proportions.sum()
            if not np.isfinite(total):
                raise ConfigError(
                    f"{where}: numpy's Dirichlet draw for class {c} is NaN with alpha={alpha}, num_clients={k} "
                    "(every Gamma draw underflowed to 0); use a larger alpha"
                )
            if total == 0:
                raise ConfigError(
                    f"{where}: class {c} has {len(idx_k)} samples but the Dirichlet shares of the "
                    f"{int((sizes < cap).sum())} client(s) still below n/K = {cap:g} samples are all exactly 0 "
                    f"(alpha={alpha}, num_clients={k}); the official code's split points become NaN here (its int "
                    "cast then hands the whole class to the last client); use a larger alpha"
                )
            proportions = proportions / total
            cuts = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            for client, piece in enumerate(np.split(idx_k, cuts)):
                parts[client].append(piece)
            sizes += np.diff(np.concatenate(([0], cuts, [len(idx_k)])))
        if sizes.min() >= min_size:
            break
    else:
        raise ConfigError(
            f"{where}: no partition with every client holding >= min_require_size={min_size} samples "
            f"in max_attempts={attempts} tries (alpha={alpha}, num_clients={k}, n={n}); "
            "raise alpha, lower num_clients or min_require_size, or raise max_attempts"
        )

    clients = []
    for client in range(k):
        members = np.concatenate(parts[client]) if parts[client] else np.zeros(0, np.int64)
        rng.shuffle(members)  # same draws as FedLab's shuffle of the Python list
        clients.append(members)
    return ClientAssignment(num_samples=n, clients=tuple(clients))


__all__ = ["IID_REMAINDERS", "iid_niidbench", "dirichlet_niidbench"]
