"""Client-level noise models: hand cases, step-by-step replays of the official code, spec fixtures."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from fnlcore.assignment import ClientAssignment
from fnlcore.errors import ConfigError
from fnlcore.noise import (
    FedNCLBernoulli,
    FedNCLGaussian,
    asymmetric_noise,
    fedcorr_noise,
    fedgr_noise,
    fedncl_bernoulli_noise,
    fedncl_gaussian_noise,
    schedules,
    symmetric_noise,
)
from fnlcore.rng import legacy_rng


def _set_partition(n: int, k: int, seed: int) -> tuple[list[set], ClientAssignment]:
    """Client index *sets* (as the official samplers build them) and the matching assignment."""
    rs = np.random.RandomState(seed)
    perm = rs.permutation(n)
    bounds = np.linspace(0, n, k + 1).astype(int)
    dict_users = [set(int(i) for i in perm[bounds[j] : bounds[j + 1]]) for j in range(k)]
    return dict_users, ClientAssignment.from_lists(n, [list(s) for s in dict_users])


def _official_fedcorr(y_train, dict_users, rho, tau, seed, num_users):
    """FedCorr util/util.py::add_noise, replayed step by step on the global numpy RNG."""
    np.random.seed(seed)
    gamma_s = np.random.binomial(1, rho, num_users)
    gamma_c_initial = np.random.rand(num_users)
    gamma_c_initial = (1 - tau) * gamma_c_initial + tau
    gamma_c = gamma_s * gamma_c_initial
    y_train_noisy = copy.deepcopy(y_train)
    for i in np.where(gamma_c > 0)[0]:
        sample_idx = np.array(list(dict_users[i]))
        prob = np.random.rand(len(sample_idx))
        noisy_idx = np.where(prob <= gamma_c[i])[0]
        y_train_noisy[sample_idx[noisy_idx]] = np.random.randint(0, 10, len(noisy_idx))
    return y_train_noisy, gamma_c


# -- FedCorr -------------------------------------------------------------------


@pytest.mark.parametrize("seed,rho,tau", [(1, 0.4, 0.0), (2, 0.6, 0.5), (3, 1.0, 0.5), (5, 0.8, 0.0)])
def test_fedcorr_matches_official_replay(seed, rho, tau):
    y = np.random.RandomState(seed + 100).randint(0, 10, 3000).astype(np.int64)
    dict_users, assignment = _set_partition(3000, 12, seed)
    expected, gamma_c = _official_fedcorr(y, dict_users, rho, tau, seed, 12)
    res = fedcorr_noise(y, assignment, rho, tau, seed, num_classes=10)
    np.testing.assert_array_equal(res.given, expected)
    np.testing.assert_array_equal(res.client_level, gamma_c)
    np.testing.assert_array_equal(res.client_noisy, gamma_c > 0)
    assert res.given.dtype == np.int64


def test_fedcorr_first10_on_100_classes_only_lands_on_0_to_9():
    y = np.full(2000, 55, dtype=np.int64)
    a = ClientAssignment.from_lists(2000, [range(0, 1000), range(1000, 2000)])
    res = fedcorr_noise(y, a, rho=1.0, tau=1.0, seed=0, num_classes=100)  # level 1: every sample redrawn
    assert set(np.unique(res.given)) <= set(range(10))
    assert res.is_noisy.all()
    res_all = fedcorr_noise(y, a, rho=1.0, tau=1.0, seed=0, num_classes=100, label_space="all")
    assert res_all.given.max() >= 10  # 2000 draws over 100 labels


def test_fedcorr_first10_needs_ten_classes():
    y = np.zeros(10, dtype=np.int64)
    a = ClientAssignment.from_lists(10, [range(10)])
    with pytest.raises(ConfigError, match="label_space"):
        fedcorr_noise(y, a, 0.5, 0.5, 0, num_classes=5)


def test_fedcorr_schedule_hand_case():
    # rho = 0 -> nobody noisy; rho = 1, tau = 1 -> every level exactly 1.
    assert (schedules.fedcorr_levels(legacy_rng(0), 7, 0.0, 0.3) == 0).all()
    assert (schedules.fedcorr_levels(legacy_rng(0), 7, 1.0, 1.0) == 1.0).all()
    # tau = 0.5: a level is 0.5 * u + 0.5, i.e. in [0.5, 1).
    lv = schedules.fedcorr_levels(legacy_rng(3), 50, 1.0, 0.5)
    r = np.random.RandomState(3)
    r.binomial(1, 1.0, 50)
    np.testing.assert_array_equal(lv, 0.5 * r.rand(50) + 0.5)


# -- FedNoRo schedule (used by H-IDN) ----------------------------------------------


def test_fednoro_schedule_exact_count_and_replay():
    noisy, eta = schedules.fednoro_levels(legacy_rng(0), 20, 0.3, 0.5, 0.7)
    assert noisy.sum() == 6  # int(0.3 * 20)
    np.random.seed(0)
    gamma_s = np.array([0.0] * 20)
    gamma_s[: int(0.3 * 20)] = 1.0
    np.random.shuffle(gamma_s)
    gamma_c_initial = (0.7 - 0.5) * np.random.rand(20) + 0.5
    np.testing.assert_array_equal(eta, gamma_s * gamma_c_initial)
    assert ((eta[noisy] >= 0.5) & (eta[noisy] < 0.7)).all()
    assert (eta[~noisy] == 0).all()


# -- Fed-NCL -------------------------------------------------------------------


@pytest.mark.parametrize(
    "p,expected",
    [
        (0.6, {0, 4, 5, 6, 10, 13, 14, 15, 16, 19}),
        (0.7, {4, 5, 6, 10, 13, 14, 15, 19}),
        (0.8, {4, 5, 6, 10, 14, 15}),
    ],
)
def test_fedncl_bernoulli_spec_fixture(p, expected):
    assert set(FedNCLBernoulli(p=p).noisy_clients(20, 42)) == expected
    y = np.random.RandomState(0).randint(0, 10, 2000).astype(np.int64)
    a = ClientAssignment.from_lists(2000, [range(i * 100, (i + 1) * 100) for i in range(20)])
    res = fedncl_bernoulli_noise(y, a, p, seed=42, num_classes=10)
    assert set(res.noisy_clients()) == expected
    client = a.client_of()
    clean = ~np.isin(client, sorted(expected))
    np.testing.assert_array_equal(res.given[clean], y[clean])
    # Every sample of a noisy client is redrawn over all 10 classes: about 90% change.
    assert 0.8 < res.is_noisy[~clean].mean() < 0.97


def test_fedncl_bernoulli_draw_order():
    y = np.arange(12, dtype=np.int64) % 3
    a = ClientAssignment.from_lists(12, [[5, 1, 3], [0, 2, 4, 6], [7, 8, 9, 10, 11]])
    res = fedncl_bernoulli_noise(y, a, 0.5, seed=7, num_classes=3, stream="numpy")
    r = np.random.RandomState(7)
    noisy = r.rand(3) <= 0.5
    expected = y.copy()
    for k in np.flatnonzero(noisy):
        idx = np.asarray(a.clients[k])
        expected[idx] = r.randint(0, 3, idx.size)
    np.testing.assert_array_equal(res.given, expected)
    # the paper variant never keeps a label of a noisy client
    for stream in ("numpy", "python"):
        res_x = fedncl_bernoulli_noise(y, a, 0.5, seed=7, num_classes=3, include_true=False, stream=stream)
        for k in res_x.noisy_clients():
            assert res_x.is_noisy[a.clients[k]].all()


# The two fixtures below are the labels of the official procedure (Fed-NCL's main_fed_noise.py +
# utils/data_preprocessing.py::generated_noise_data), obtained once with a 15-line throwaway script that
# does only what the official code does, with NumPy and Python's random directly (no project code):
#   np.random.seed(s); degree_k = 1.0 if np.random.rand() <= 1 - p else 0.0   (Bernoulli, per client)
#                      or degree = np.random.normal(mu, sigma, K)              (Gaussian, no clipping)
#   random.seed(s); for k in clients, for i in client k's list: if random.random() < degree_k:
#                                                                   label[i] = random.randint(0, C - 1)
# and pasted here as literals.
def test_fedncl_bernoulli_official_labels_fixture():
    y = np.arange(12, dtype=np.int64) % 3
    a = ClientAssignment.from_lists(12, [[5, 1, 3], [0, 2, 4, 6], [7, 8, 9, 10, 11]])
    res = fedncl_bernoulli_noise(y, a, 0.5, seed=7, num_classes=3)  # degrees (1, 0, 1)
    assert res.noisy_clients() == [0, 2]
    assert res.given.tolist() == [0, 0, 2, 2, 1, 0, 0, 1, 0, 0, 0, 2]


def test_fedncl_gaussian_official_labels_fixture():
    y = (3 * np.arange(20, dtype=np.int64)) % 10
    a = ClientAssignment.from_lists(
        20, [[4, 0, 2, 1, 3], [9, 8, 7, 6, 5], [10, 11, 12, 13, 14], [19, 15, 18, 16, 17]]
    )
    # degrees 0.6235, 0.3378, 0.6915, 1.0854 (> 1: every sample redrawn, as the clip to 1)
    res = fedncl_gaussian_noise(y, a, 0.4, 0.45, seed=42, num_classes=10)
    assert res.given.tolist() == [4, 3, 2, 9, 2, 5, 8, 1, 6, 7, 8, 7, 0, 9, 6, 5, 5, 0, 6, 2]


def test_fedncl_bernoulli_extremes():
    assert FedNCLBernoulli(p=1.0).noisy_clients(20, 5) == []
    assert FedNCLBernoulli(p=0.0).noisy_clients(20, 5) == list(range(20))


@pytest.mark.parametrize("mu,sigma", [(0.4, 0.45), (0.3, 0.45), (0.3, 0.4)])
def test_fedncl_gaussian_spec_fixture(mu, sigma):
    assert len(FedNCLGaussian(mu=mu, sigma=sigma).noisy_clients(20, 42)) == 15
    x = schedules.fedncl_gaussian_levels(legacy_rng(42), 20, mu, sigma)
    raw = np.random.RandomState(42).normal(mu, sigma, 20)
    np.testing.assert_array_equal(x, np.clip(raw, 0, 1))


def test_fedncl_gaussian_draw_order_and_truncnorm():
    y = np.random.RandomState(1).randint(0, 10, 600).astype(np.int64)
    a = ClientAssignment.from_lists(600, [range(i * 30, (i + 1) * 30) for i in range(20)])
    res = fedncl_gaussian_noise(y, a, 0.4, 0.45, seed=42, num_classes=10, stream="numpy")
    r = np.random.RandomState(42)
    x = np.clip(r.normal(0.4, 0.45, 20), 0, 1)
    expected = y.copy()
    for k in np.flatnonzero(x > 0):
        idx = np.asarray(a.clients[k])
        sel = np.flatnonzero(r.rand(idx.size) <= x[k])
        expected[idx[sel]] = r.randint(0, 10, sel.size)
    np.testing.assert_array_equal(res.given, expected)
    np.testing.assert_array_equal(res.client_level, x)

    t = schedules.fedncl_gaussian_levels(legacy_rng(42), 2000, 0.3, 0.45, "truncnorm")
    assert (t > 0).all() and (t < 1).all()  # a true truncation never lands on the bounds
    c = schedules.fedncl_gaussian_levels(legacy_rng(42), 2000, 0.3, 0.45, "clip")
    assert (c == 0).sum() > 100  # clipping piles mass on 0
    assert (schedules.fedncl_gaussian_levels(legacy_rng(0), 5, 0.3, 0.0, "truncnorm") == 0.3).all()


# -- FedGR ---------------------------------------------------------------------


def test_fedgr_draw_order_replay():
    y = np.random.RandomState(2).randint(0, 10, 1000).astype(np.int64)
    a = ClientAssignment.from_lists(1000, [np.random.RandomState(9).permutation(1000)[i::10] for i in range(10)])
    res = fedgr_noise(y, a, "mixed", 0.6, 0.2, 0.4, seed=13, num_classes=10, asym_map="cyclic")
    r = np.random.RandomState(13)
    noisy = np.sort(r.permutation(10)[:6])
    kinds = np.where(r.rand(6) < 0.5, "sym", "asym")
    rates = r.uniform(0.2, 0.4, 6)
    expected = y.copy()
    for k, kind, rate in zip(noisy, kinds, rates):
        idx = a.clients[k]
        m = int(idx.size * rate)
        chosen = idx[r.choice(idx.size, m, replace=False)]
        if kind == "sym":
            expected[chosen] = (y[chosen] + r.randint(1, 10, m)) % 10
        else:
            expected[chosen] = (y[chosen] + 1) % 10
        assert res.is_noisy[idx].sum() == m  # sym excludes the true class, cyclic always moves
    np.testing.assert_array_equal(res.given, expected)
    assert res.noisy_clients() == noisy.tolist()
    assert [res.client_type[k] for k in noisy] == kinds.tolist()
    np.testing.assert_array_equal(res.client_level[noisy], rates)


def test_fedgr_phi_counts_and_auto_map():
    y = np.arange(1000, dtype=np.int64) % 100
    a = ClientAssignment.from_lists(1000, [range(i * 10, (i + 1) * 10) for i in range(100)])
    res = fedgr_noise(y, a, "asym", 0.6, 1.0, 1.0, seed=1, num_classes=100)
    assert len(res.noisy_clients()) == 60
    changed = res.is_noisy
    # auto on 100 classes = next_in_group: 4 -> 0, 7 -> 8
    g = y[changed]
    np.testing.assert_array_equal(res.given[changed], (g // 5) * 5 + (g % 5 + 1) % 5)


# -- all-client symmetric / asymmetric -----------------------------------------------


def test_symmetric_exact_count_hand_case():
    y = np.array([0, 1, 2, 3, 0, 1, 2, 3], dtype=np.int64)
    a = ClientAssignment.from_lists(8, [[0, 1, 2, 3], [4, 5, 6, 7]])
    res = symmetric_noise(y, a, 0.5, seed=0, num_classes=4)
    assert res.is_noisy[:4].sum() == 2 and res.is_noisy[4:].sum() == 2
    r = np.random.RandomState(0)
    expected = y.copy()
    for idx in ([0, 1, 2, 3], [4, 5, 6, 7]):
        chosen = np.array(idx)[r.choice(4, 2, replace=False)]
        expected[chosen] = (y[chosen] + r.randint(1, 4, 2)) % 4
    np.testing.assert_array_equal(res.given, expected)


def test_asymmetric_classic_hand_case():
    y = np.arange(10, dtype=np.int64)
    a = ClientAssignment.from_lists(10, [range(10)])
    res = asymmetric_noise(y, a, 1.0, seed=0, num_classes=10)
    np.testing.assert_array_equal(res.given, [0, 1, 0, 5, 7, 3, 6, 7, 8, 1])
    np.testing.assert_array_equal(np.flatnonzero(res.is_noisy), [2, 3, 4, 5, 9])
    with pytest.raises(ConfigError, match="asym_map"):
        asymmetric_noise(np.zeros(4, np.int64), ClientAssignment.from_lists(4, [range(4)]), 0.5, 0, 5)


def test_unassigned_samples_are_untouched():
    y = np.zeros(100, dtype=np.int64)
    a = ClientAssignment.from_lists(100, [range(0, 40), range(40, 80)])  # 80..99 belong to nobody
    for res in (
        fedcorr_noise(y, a, 1.0, 1.0, 0, 10),
        symmetric_noise(y, a, 1.0, 0, 10),
        fedncl_bernoulli_noise(y, a, 0.0, 0, 10),
    ):
        assert (res.given[80:] == 0).all() and not res.is_noisy[80:].any()
