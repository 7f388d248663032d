"""Sample-level building blocks: which samples of a client are corrupted, and to what.

Every function draws from the RandomState it is given with one vectorised call,
in the same order as the official generators (so a sequence of these calls
reproduces their random stream). Positions refer to a client's sample list in
the client's order (``ClientAssignment.clients[k]``).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

# -- selection -----------------------------------------------------------------


def select_bernoulli(rng: np.random.RandomState, n: int, level: float) -> np.ndarray:
    """Positions whose uniform draw is <= ``level`` (one ``rand(n)``), ascending.

    FedCorr ``add_noise`` / FedNoRo ``n_type="random"``: ``r = rand(N_k); r <= level``.
    The number selected is Binomial(n, level).
    """
    r = rng.rand(n)
    return np.flatnonzero(r <= level)


def select_exact(rng: np.random.RandomState, n: int, count: int) -> np.ndarray:
    """``count`` distinct positions uniformly without replacement, in drawn order.

    ``rng.choice(n, count, replace=False)`` (legacy: ``permutation(n)[:count]``,
    so it consumes n draws whatever ``count`` is).
    """
    return rng.choice(n, size=count, replace=False)


def select_weighted(rng: np.random.RandomState, weights: np.ndarray, count: int) -> np.ndarray:
    """``count`` distinct positions drawn with probabilities ``weights`` (summing to 1), without replacement.

    Numpy's legacy weighted sampling without replacement (repeated inverse-CDF
    rounds that drop already-found positions), exactly as FedNoRo's H-IDN calls
    it; other weighted-without-replacement algorithms give different draws.
    """
    return rng.choice(weights.shape[0], size=count, replace=False, p=weights)


def exact_count(n: int, rate: float) -> int:
    """``int(rate * n)``: the float product truncated, as the official code computes it."""
    return int(rate * n)


# -- replacement ---------------------------------------------------------------


def replace_uniform(rng: np.random.RandomState, count: int, num_labels: int) -> np.ndarray:
    """New labels uniform over 0..num_labels-1, the true class included (``randint(0, L, count)``).

    FedCorr / FedDiv use ``num_labels = 10`` on every dataset (label space
    "first10"); Fed-NCL uses all C classes.
    """
    return rng.randint(0, num_labels, count)


def replace_other(rng: np.random.RandomState, true: np.ndarray, num_classes: int) -> np.ndarray:
    """New labels uniform over the other C-1 classes: ``(y + randint(1, C)) mod C``; never the true class."""
    if num_classes < 2:
        raise ConfigError("symmetric noise that excludes the true class needs at least 2 classes")
    true = np.asarray(true, dtype=np.int64)
    return (true + rng.randint(1, num_classes, true.shape[0])) % num_classes


def replace_mapped(true: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """Deterministic asymmetric flip: ``mapping[y]`` (no random draw)."""
    return np.asarray(mapping, dtype=np.int64)[np.asarray(true, dtype=np.int64)]
