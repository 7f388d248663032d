"""Exact, fast reproduction of the official "draw from the remaining pool" loop.

FedCorr's ``iid_sampling`` (also FedNoRo, FedDiv, FedMLP) and Fed-NCL's
``cifar_iid``/``mnist_iid``/``unbalance_iid`` all do, for client k = 0..K-1::

    chosen = np.random.choice(pool, size_k, replace=False)   # pool is a list
    pool   = list(set(pool) - set(chosen))

``choice(..., replace=False)`` on the legacy RNG is ``pool[permutation(len(pool))[:size]]``,
so the random draws depend only on ``len(pool)``, but *which* samples they pick
depends on the order of ``pool``: the iteration order of a CPython set of ints.
Reproducing it with real sets costs ~70 ns per pool element and step (33 s for
n = 1,000,000, K = 500). This module avoids that work where it is provably not
needed:

For non-negative ints ``hash(i) == i`` and a key's home slot is ``i & mask``.
When a table of size T (a power of two) holds only keys < T, every key sits in
its own home slot, so the set iterates in ascending order whatever the
insertion order. The table sizes CPython picks are a pure function of the
element counts (growth rule of ``set_add_entry``, one big resize in
``set_merge``, the dummy-purge resize in ``set_difference_update``), computed
by :func:`grown_table_size` and :func:`resized_table_size`. Whenever the table
that holds the new pool is larger than its largest key, the new pool is simply
the sorted remainder (numpy, ~2 ns per element). Otherwise (small pools with
large keys: collisions, linear probing, perturbation) the step runs on real
CPython sets, which are exact by definition. For n = 1,000,000 this covers the
pools above ~315,000 elements with numpy; the rest runs on sets.

The rules reproduced are those of CPython 3.11's ``Objects/setobject.c``
(unchanged in this respect since 3.7, the version the official code ran on).
Tests compare the result with a literal re-implementation of the official loop
over many sizes (tests/test_partition_setorder.py).
"""

from __future__ import annotations

from typing import Iterable, Literal, Sequence

import numpy as np

PYSET_MINSIZE = 8  # CPython's smallest set table

ClientOrder = Literal["set", "draw"]


def resized_table_size(minused: int) -> int:
    """``set_table_resize``: the smallest power of two, at least 8, that is > ``minused``."""
    size = PYSET_MINSIZE
    while size <= minused:
        size <<= 1
    return size


def growth_target(used: int) -> int:
    """The ``minused`` a growing (or dummy-purging) set asks ``set_table_resize`` for."""
    return used * 2 if used > 50000 else used * 4


def grown_table_size(count: int) -> int:
    """Table size of a set built by adding ``count`` distinct keys one by one to ``set()``.

    ``set_add_entry`` resizes right after the insertion that makes
    ``fill * 5 >= mask * 3``; without deletions fill equals the element count.
    """
    size = PYSET_MINSIZE
    while True:
        mask = size - 1
        trigger = -(-3 * mask // 5)  # smallest fill with fill * 5 >= mask * 3
        if count < trigger:
            return size
        size = resized_table_size(growth_target(trigger))


def difference_is_sorted(pool_size: int, num_chosen: int, max_pool: int, max_rest: int) -> bool:
    """Whether ``list(set(pool) - chosen)`` comes out in ascending order.

    ``pool`` holds ``pool_size`` distinct non-negative ints with maximum
    ``max_pool``, ``chosen`` is a set of ``num_chosen`` of them, ``max_rest`` is
    the maximum of what remains (-1 if nothing). The order is ascending when the
    table it is read from is larger than every key it holds (each key then sits
    in its home slot), or is a verbatim copy of such a table.
    """
    rest = pool_size - num_chosen
    if rest <= 0:
        return True
    source_size = grown_table_size(pool_size)  # set(pool), built from a list
    source_sorted = source_size > max_pool
    if (pool_size >> 2) > num_chosen:
        # set_difference -> set_copy_and_difference: copy (set_merge into an empty set), then discard.
        copy_size = resized_table_size(2 * pool_size) if pool_size * 5 >= 3 * (PYSET_MINSIZE - 1) else PYSET_MINSIZE
        if copy_size == source_size:
            is_sorted = source_sorted  # same size and no dummies: slots copied verbatim
        else:
            is_sorted = copy_size > max_pool  # re-inserted into a fresh table
        if num_chosen > (copy_size - 1) // 4:  # more than 1/4 dummies: rebuilt without them
            is_sorted = resized_table_size(growth_target(rest)) > max_rest
        return is_sorted
    # set_difference, other branch: a fresh set filled by set_add_entry in source order.
    return grown_table_size(rest) > max_rest


def draw_from_pool(
    num_samples: int,
    sizes: Sequence[int],
    rng: np.random.RandomState,
    client_order: ClientOrder = "set",
) -> list[np.ndarray]:
    """Clients drawn one after another without replacement from the shrinking pool.

    Reproduces the official loop above exactly (same RNG draws, same samples,
    same order). ``client_order="set"`` returns each client in the iteration
    order of ``set(chosen)`` (FedCorr/FedNoRo/FedDiv/FedMLP keep the set or
    ``list(set)``); ``"draw"`` keeps the order ``choice`` returned (Fed-NCL keeps
    ``list(np.random.choice(...))``). The pool update never depends on the
    client order, so both give the same client *contents*.
    """
    pool_sorted: np.ndarray | None = np.arange(num_samples, dtype=np.int64)  # list(range(n)) is ascending
    pool_list: list[int] | None = None  # the pool in CPython set order, when not ascending
    max_pool = num_samples - 1
    clients: list[np.ndarray] = []
    for k, size in enumerate(sizes):
        pool_size = len(pool_sorted) if pool_sorted is not None else len(pool_list)
        if size > pool_size:  # np.random.choice would raise; callers size the draws correctly
            raise ValueError(f"client {k} asks for {size} samples but only {pool_size} remain")
        picks = rng.permutation(pool_size)[:size]  # legacy choice(replace=False): always a full permutation
        if pool_sorted is not None:
            chosen = pool_sorted[picks]
        else:
            chosen = np.array([pool_list[i] for i in picks.tolist()], dtype=np.int64)
        chosen_list = chosen.tolist()
        chosen_set = set(chosen_list)
        if client_order == "set":
            clients.append(np.fromiter(chosen_set, dtype=np.int64, count=len(chosen_set)))
        else:
            clients.append(chosen)
        if k == len(sizes) - 1:
            break  # the official loop still updates the pool, but nothing reads it
        if pool_sorted is not None:
            keep = np.ones(pool_size, dtype=bool)
            keep[picks] = False
            rest = pool_sorted[keep]
            max_rest = int(rest[-1]) if rest.size else -1
            if difference_is_sorted(pool_size, size, max_pool, max_rest):
                pool_sorted = rest
            else:
                pool_list = list(set(pool_sorted.tolist()) - chosen_set)
                pool_sorted = None
        else:
            if max_pool in chosen_set:
                rest_iter: Iterable[int] = (x for x in pool_list if x not in chosen_set)
                max_rest = max(rest_iter, default=-1)
            else:
                max_rest = max_pool
            if difference_is_sorted(pool_size, size, max_pool, max_rest):
                rest = np.array(pool_list, dtype=np.int64)
                rest = np.sort(rest[~np.isin(rest, chosen)])
                pool_sorted, pool_list = rest, None
            else:
                pool_list = list(set(pool_list) - chosen_set)
        max_pool = max_rest
    return clients
