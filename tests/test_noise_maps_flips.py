"""Asymmetric maps and the sample-level selection / replacement blocks."""

from __future__ import annotations

import numpy as np
import pytest

from fnlcore.errors import ConfigError
from fnlcore.noise import flips, maps


def test_named_maps_hand_values():
    np.testing.assert_array_equal(maps.cifar10_classic_map(), [0, 1, 0, 5, 7, 3, 6, 7, 8, 1])
    np.testing.assert_array_equal(maps.cyclic_map(4), [1, 2, 3, 0])
    np.testing.assert_array_equal(maps.next_in_group_map(10), [1, 2, 3, 4, 0, 6, 7, 8, 9, 5])
    g = maps.next_in_group_map(100)
    assert g[4] == 0 and g[99] == 95 and g[57] == 58
    assert (np.sort(g) == np.arange(100)).all()  # a permutation


def test_resolve_map_aliases_and_lists():
    np.testing.assert_array_equal(maps.resolve_map("classic", 10), maps.cifar10_classic_map())
    np.testing.assert_array_equal(maps.resolve_map("group", 10), maps.next_in_group_map(10))
    np.testing.assert_array_equal(maps.resolve_map([1, 0, 2], 3), [1, 0, 2])
    assert maps.canonical_map("classic") == "cifar10_classic"
    assert maps.canonical_map([2, 1, 0]) == (2, 1, 0)


@pytest.mark.parametrize(
    "value,c,match",
    [
        ([1, 0], 3, "2 entries but the dataset has 3"),
        ([0, 1, 3], 3, r"targets must lie in \[0, 3\)"),
        ([0, -1, 1], 3, "non-negative"),
        ("cifar10_classic", 100, "10 classes"),
        ("next_in_group", 12, "divisible by 5"),
        ("bogus", 10, "not a known map"),
        (3.5, 10, "map name or a list"),
    ],
)
def test_bad_maps_raise_config_error_naming_the_key(value, c, match):
    with pytest.raises(ConfigError, match=match) as e:
        maps.resolve_map(value, c)
    assert "asym_map" in str(e.value)


def test_select_bernoulli_matches_rand_threshold():
    got = flips.select_bernoulli(np.random.RandomState(0), 20, 0.3)
    r = np.random.RandomState(0).rand(20)
    np.testing.assert_array_equal(got, np.flatnonzero(r <= 0.3))
    assert flips.select_bernoulli(np.random.RandomState(0), 20, 1.0).size == 20


def test_select_exact_is_choice_without_replacement():
    got = flips.select_exact(np.random.RandomState(5), 30, 7)
    np.testing.assert_array_equal(got, np.random.RandomState(5).permutation(30)[:7])
    assert len(set(got.tolist())) == 7


def test_select_weighted_respects_zero_weights():
    w = np.array([0.0, 0.5, 0.0, 0.25, 0.25])
    got = flips.select_weighted(np.random.RandomState(1), w, 3)
    assert sorted(got.tolist()) == [1, 3, 4]


def test_replacements():
    rs = np.random.RandomState(0)
    y = np.repeat(np.arange(5), 200)
    other = flips.replace_other(rs, y, 5)
    assert (other != y).all() and set(np.unique(other)) == set(range(5))
    counts = np.bincount(other[y == 0], minlength=5)
    assert counts[0] == 0 and counts[1:].min() > 25  # ~50 each among classes 1..4
    incl = flips.replace_uniform(np.random.RandomState(0), 1000, 10)
    np.testing.assert_array_equal(incl, np.random.RandomState(0).randint(0, 10, 1000))
    np.testing.assert_array_equal(flips.replace_mapped(np.array([9, 2, 0]), maps.cifar10_classic_map()), [1, 0, 0])
    with pytest.raises(ConfigError):
        flips.replace_other(rs, np.zeros(3, np.int64), 1)


def test_exact_count_truncates_the_float_product():
    assert flips.exact_count(500, 0.3) == 150
    assert flips.exact_count(7, 0.5) == 3
    assert flips.exact_count(100, 0.29) == 28  # 0.29 * 100 = 28.999999999999996, as int() in the official code
