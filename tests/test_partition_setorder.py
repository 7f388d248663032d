"""The CPython set-order shortcut of fnlcore.partition.setorder against real CPython sets."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fnlcore.partition.setorder import (
    difference_is_sorted,
    draw_from_pool,
    grown_table_size,
    resized_table_size,
)

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_EMPTY = sys.getsizeof(set())


def table_size(s: set) -> int:
    """Hash-table size of a real set (``__sizeof__`` counts the table unless it is the built-in 8 slots)."""
    extra = sys.getsizeof(s) - _EMPTY
    return extra // 16 if extra else 8


def official_pool_loop(n: int, sizes: list[int], seed: int, keep_set: bool) -> list[list[int]]:
    """The official loop, literally: choice from the list, then list(set(pool) - set(chosen))."""
    rng = np.random.RandomState(seed)
    pool = list(range(n))
    out = []
    for size in sizes:
        chosen = rng.choice(pool, size, replace=False) if pool else np.zeros(0, dtype=np.int64)
        out.append([int(x) for x in (set(chosen) if keep_set else list(chosen))])
        pool = list(set(pool) - set(chosen))
    return out


def test_small_table_sizes_by_hand():
    # 4 keys fit the 8-slot table; the 5th reaches fill*5 >= 7*3 and the table grows to 32.
    assert grown_table_size(0) == 8
    assert grown_table_size(4) == 8
    assert grown_table_size(5) == 32
    assert resized_table_size(10) == 16
    assert resized_table_size(16) == 32
    assert resized_table_size(0) == 8


@pytest.mark.parametrize("count", [0, 1, 4, 5, 6, 19, 20, 77, 78, 300, 1229, 1230, 4915, 19660, 19661,
                                   50000, 78643, 78644, 157286, 157287])
def test_grown_table_size_matches_cpython(count):
    assert table_size(set(range(count))) == grown_table_size(count)


@given(st.integers(0, 40000))
@PROPS
def test_grown_and_copied_table_sizes_match_cpython(count):
    keys = list(range(0, 3 * count, 3))  # not all < table size: order differs, sizes must not
    s = set(keys)
    assert table_size(s) == grown_table_size(count)
    copy_size = resized_table_size(2 * count) if count >= 5 else 8
    assert table_size(set(s)) == copy_size


@given(
    n=st.integers(1, 4000),
    frac=st.floats(0.0, 1.0),
    spread=st.sampled_from([1, 2, 5, 40]),
    seed=st.integers(0, 2**32 - 1),
)
@PROPS
def test_difference_is_sorted_never_lies(n, frac, spread, seed):
    rs = np.random.RandomState(seed % (2**32))
    pool = (rs.permutation(n) * spread).tolist()  # shuffled keys, possibly above the table size
    pool = list(set(pool))  # the pool is always the iteration order of an earlier set
    m = int(frac * len(pool))
    chosen = set(rs.permutation(pool)[:m].tolist())
    rest = list(set(pool) - chosen)
    predicted = difference_is_sorted(len(pool), m, max(pool), max(rest) if rest else -1)
    if predicted:
        assert rest == sorted(rest)


@given(
    n=st.integers(1, 2500),
    k=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    order=st.sampled_from(["set", "draw"]),
)
@PROPS
def test_draw_from_pool_equals_official_loop(n, k, seed, order):
    k = min(k, n)
    sizes = [n // k] * k
    ours = draw_from_pool(n, sizes, np.random.RandomState(seed), order)
    assert [c.tolist() for c in ours] == official_pool_loop(n, sizes, seed, keep_set=order == "set")


@given(n=st.integers(1, 1500), seed=st.integers(0, 2**31), data=st.data())
@PROPS
def test_draw_from_pool_with_uneven_sizes(n, seed, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=0, max_size=12)))
    sizes = np.diff([0, *cuts, n]).tolist()  # sums to n, zeros allowed
    ours = draw_from_pool(n, sizes, np.random.RandomState(seed), "draw")
    assert [c.tolist() for c in ours] == official_pool_loop(n, sizes, seed, keep_set=False)


@pytest.mark.parametrize("n,k", [(47116, 8), (60000, 20), (70001, 3), (120000, 4), (131072 + 5, 9)])
def test_draw_from_pool_around_large_table_thresholds(n, k):
    # sizes where the 50,000-element growth rule, the copy/re-insert branches and K <= 4
    # (the non-copy branch of set_difference) all occur
    sizes = [n // k] * k
    ours = draw_from_pool(n, sizes, np.random.RandomState(n + k), "set")
    assert [c.tolist() for c in ours] == official_pool_loop(n, sizes, n + k, keep_set=True)


def test_draw_from_pool_refuses_oversized_draw():
    with pytest.raises(ValueError, match="only 3 remain"):
        draw_from_pool(3, [4], np.random.RandomState(0))


def test_both_paths_are_exercised(monkeypatch):
    """A 2,500-sample, 40-client split uses the numpy shortcut early and real sets late."""
    import fnlcore.partition.setorder as setorder

    verdicts = []
    original = setorder.difference_is_sorted

    def spy(*args):
        verdicts.append(original(*args))
        return verdicts[-1]

    monkeypatch.setattr(setorder, "difference_is_sorted", spy)
    ours = setorder.draw_from_pool(2500, [62] * 40, np.random.RandomState(7), "set")
    assert True in verdicts and False in verdicts
    assert [c.tolist() for c in ours] == official_pool_loop(2500, [62] * 40, 7, keep_set=True)


def test_every_small_split_matches_and_returns_to_sorted_pools(monkeypatch):
    """Exhaustive n <= 80: also covers pools that leave the real-set path again (np.isin branch)."""
    import fnlcore.partition.setorder as setorder

    calls = []
    real_isin = np.isin
    monkeypatch.setattr(setorder.np, "isin", lambda *a, **k: calls.append(1) or real_isin(*a, **k))
    for n in range(1, 81):
        for k in range(1, min(n, 12) + 1):
            sizes = [n // k] * k
            ours = draw_from_pool(n, sizes, np.random.RandomState(n * 31 + k), "set")
            assert [c.tolist() for c in ours] == official_pool_loop(n, sizes, n * 31 + k, keep_set=True), (n, k)
    assert calls  # the list -> sorted transition happened at least once
