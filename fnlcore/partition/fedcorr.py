"""FedCorr's partitioners (``util/sampling.py`` of Xu-Jingyi/FedCorr), reused verbatim
by FedNoRo (seed fixed at 100), FedDiv, FedMLP (IID) and Fed-NCL (IID, non-IID).

Seed convention: called with ``seed`` these return what the official functions
return after their own ``np.random.seed(seed)``, client order included.
"""

from __future__ import annotations

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError
from ..rng import legacy_rng
from ._checks import check_clients, check_float, check_num_samples, check_seed, single_labels
from .setorder import ClientOrder, draw_from_pool

# Whole-row redraws of the class-presence matrix before giving up (the official
# loop has no bound; only p so small that a client almost never gets a class hits it).
MAX_ROW_REDRAWS = 100_000


def iid_fedcorr(num_samples: int, num_clients: int, seed: int, client_order: ClientOrder = "set") -> ClientAssignment:
    """Equal-size IID split, FedCorr's ``iid_sampling(n, K, seed)``.

    Paper/code: FedCorr (also FedNoRo's IID option, FedDiv, FedMLP's split and
    Fed-NCL's ``cifar_iid``/``mnist_iid``). Each client in turn draws
    ``m = int(n / K)`` samples without replacement from the remaining pool; the
    remainder ``n - K*m`` stays unassigned.

    Parameters
    ----------
    num_samples: n, size of the training split.
    num_clients: K.
    seed: as ``np.random.seed(seed)`` right before the official call.
    client_order: ``"set"`` (default; FedCorr/FedNoRo/FedDiv/FedMLP: a client's
        samples in the iteration order of the Python set the code keeps) or
        ``"draw"`` (Fed-NCL's ``list(np.random.choice(...))``). Same contents.

    [CODE≠PAPER] FedDiv's text says every client gets the same number of
    samples *of each class*; the code equalises only the total (see
    :func:`iid_per_class_equal` for the paper-text variant).
    """
    where = "iid_fedcorr"
    n = check_num_samples(where, num_samples)
    k = check_clients(where, num_clients, n)
    seed = check_seed(where, seed)
    _check_order(where, client_order)
    per_client = int(n / k)  # the official int(n_train / num_users), float division included
    clients = draw_from_pool(n, [per_client] * k, legacy_rng(seed), client_order)
    return ClientAssignment(num_samples=n, clients=tuple(clients))


def iid_per_class_equal(labels: np.ndarray, num_clients: int, seed: int) -> ClientAssignment:
    """Paper-text IID of FedDiv: every client gets floor(n_c / K) samples of every class c.

    Not in any official code (the code is :func:`iid_fedcorr`); our construction:
    for c = 0..C-1 in order, ``permutation(n_c)`` of the class's ascending
    indices, cut into K consecutive parts of floor(n_c / K) (the remainder is
    unassigned); a client's list is its parts in class order.
    """
    where = "iid_per_class_equal"
    y, num_classes = single_labels(where, labels)
    k = check_clients(where, num_clients, y.size)
    rng = legacy_rng(check_seed(where, seed))
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c in range(num_classes):
        idx_c = np.flatnonzero(y == c)
        per_client = idx_c.size // k
        shuffled = idx_c[rng.permutation(idx_c.size)]
        for client, chunk in enumerate(np.split(shuffled[: per_client * k], k)):
            parts[client].append(chunk)
    return ClientAssignment(num_samples=y.size, clients=tuple(np.concatenate(p) for p in parts))


def bernoulli_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    p: float,
    alpha: float,
    seed: int,
    num_classes: int | None = None,
) -> ClientAssignment:
    """Non-IID Bernoulli-Dirichlet split, FedCorr's ``non_iid_dirichlet_sampling``.

    Paper/code: FedCorr; used by FedNoRo (K=20, ICH p=0.9 alpha=2, ISIC p=0.99
    alpha=1.5, seed fixed at 100), FedDiv and Fed-NCL's non-IID setting.

    1. Phi ~ Bernoulli(p)^(K x C) in one ``binomial`` call; clients without a
       class redraw their whole row (one call of size (#bad, C)) until none is left.
    2. A class without any owner is an error here (the official code crashes).
    3. For c = 0..C-1: q ~ Dirichlet(alpha * 1) over the owners (ascending);
       every sample of c (ascending index) goes to an owner drawn with
       ``choice(owners, size=n_c, p=q)``: no rounding, no minimum size.
    4. Client k's collection is built exactly as the code does,
       ``set(S_k | set(new))`` class after class, and the client's order is the
       iteration order of that final set (it drives the noise draws later).

    Parameters
    ----------
    labels: (n,) non-negative int class indices (row order of the training split).
    num_clients: K.
    p: probability that a client holds a class, in (0, 1].
    alpha: Dirichlet concentration, > 0.
    seed: as ``np.random.seed(seed)`` right before the official call.
    num_classes: C; defaults to ``max(labels) + 1``. It sets the width of Phi,
        so it changes the draws when some classes have no samples.
    """
    where = "bernoulli_dirichlet"
    y, c_total = single_labels(where, labels, num_classes)
    k = check_clients(where, num_clients, y.size)
    p = check_float(where, "p", p, 0.0, 1.0, low_open=True, hint="probability that a client holds a class")
    alpha = check_float(where, "alpha", alpha, 0.0, None, low_open=True, hint="Dirichlet concentration")
    rng = legacy_rng(check_seed(where, seed))

    phi = rng.binomial(1, p, size=(k, c_total))
    classes_per_client = phi.sum(axis=1)
    redraws = 0
    while classes_per_client.min() == 0:
        redraws += 1
        if redraws > MAX_ROW_REDRAWS:
            raise ConfigError(
                f"{where}: after {MAX_ROW_REDRAWS} redraws some client still holds no class "
                f"(p={p}, num_classes={c_total}); increase p"
            )
        bad = np.flatnonzero(classes_per_client == 0)
        phi[bad] = rng.binomial(1, p, size=(bad.size, c_total))
        classes_per_client = phi.sum(axis=1)
    ownerless = np.flatnonzero(phi.sum(axis=0) == 0)
    if ownerless.size:
        raise ConfigError(
            f"{where}: class {int(ownerless[0])} has no owner (no client drew it) with p={p}, "
            f"num_clients={k}, seed={seed}; the official code would crash here. "
            "Use a larger p or num_clients, or another seed"
        )

    by_class = np.argsort(y, kind="stable")  # ascending indices within each class
    class_bounds = np.searchsorted(y[by_class], np.arange(c_total + 1))
    collections: dict[int, set[int]] = {}
    for c in range(c_total):
        idx_c = by_class[class_bounds[c] : class_bounds[c + 1]]
        owners = np.flatnonzero(phi[:, c])
        q = rng.dirichlet([alpha] * owners.size)
        assignment = rng.choice(owners, size=idx_c.size, p=q.tolist())
        # group the class's samples by owner, keeping ascending index order within each owner
        order = np.argsort(assignment, kind="stable")
        cuts = np.searchsorted(assignment[order], owners, side="left").tolist() + [idx_c.size]
        grouped = idx_c[order]
        for j, owner in enumerate(owners.tolist()):
            new = set(grouped[cuts[j] : cuts[j + 1]].tolist())
            if owner in collections:
                collections[owner] = set(collections[owner] | new)  # the official union, copy included
            else:
                collections[owner] = new
    clients = tuple(np.fromiter(collections[i], dtype=np.int64, count=len(collections[i])) for i in range(k))
    return ClientAssignment(num_samples=y.size, clients=clients)


def _check_order(where: str, client_order: str) -> None:
    if client_order not in ("set", "draw"):
        raise ConfigError(
            f"{where}: client_order={client_order!r} must be 'set' (FedCorr/FedNoRo/FedDiv/FedMLP) "
            "or 'draw' (Fed-NCL)"
        )


__all__ = ["iid_fedcorr", "iid_per_class_equal", "bernoulli_dirichlet"]
