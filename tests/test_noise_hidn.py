"""FedNoRo H-IDN: official replay (per-sample loop on the global RNG), hand cases, guards, ICH fixture."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from fnlcore.assignment import ClientAssignment
from fnlcore.errors import DataError
from fnlcore.noise import FedNoRoHIDN, fednoro_noisy_clients, hidn_noise
from fnlcore.noise.hidn import draw_other_labels, misclassification_weights


def _official_hidn(y_train, dict_users, soft_label, rho, eta_l, eta_u, seed, num_users, n_classes):
    """FedNoRo utils/utils.py::add_noise (n_type='instance'), replayed step by step."""
    np.random.seed(seed)
    gamma_s = np.array([0.0] * num_users)
    gamma_s[: int(rho * num_users)] = 1.0
    np.random.shuffle(gamma_s)
    gamma_c_initial = np.random.rand(num_users)
    gamma_c_initial = (eta_u - eta_l) * gamma_c_initial + eta_l
    gamma_c = gamma_s * gamma_c_initial
    y_train_noisy = copy.deepcopy(y_train)
    for i in np.where(gamma_c > 0)[0]:
        sample_idx = np.array(list(dict_users[i]))
        soft_this = soft_label[sample_idx]
        hard_this = y_train[sample_idx]
        p_t = copy.deepcopy(soft_this[np.arange(soft_this.shape[0]), hard_this])
        p_f = 1 - p_t
        p_f = p_f / p_f.sum()
        noisy_idx = np.random.choice(
            np.arange(len(sample_idx)), size=int(gamma_c[i] * len(sample_idx)), replace=False, p=p_f
        )
        for j in noisy_idx:
            soft_this[j][hard_this[j]] = 0.0
            soft_this[j] = soft_this[j] / soft_this[j].sum()
            y_train_noisy[sample_idx[j]] = np.random.choice(np.arange(n_classes), p=soft_this[j])
    return y_train_noisy, gamma_s, gamma_c


def _soft_for(y, num_classes, seed, sharp=3.0):
    """Plausible annotator output: a Dirichlet row with extra mass on the true class."""
    rs = np.random.RandomState(seed)
    alpha = np.ones((y.size, num_classes))
    alpha[np.arange(y.size), y] += sharp
    g = rs.gamma(alpha)
    return g / g.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def ich_labels(spec_data_dir):
    df = pd.read_csv(spec_data_dir / "fednoro_train_ICH.csv")
    return df.iloc[:, 1:6].to_numpy().argmax(axis=1).astype(np.int64)


@pytest.mark.parametrize("rho,eta_l,eta_u,seed", [(0.4, 0.3, 0.5, 0), (0.6, 0.5, 0.7, 1)])
def test_hidn_matches_official_replay_on_ich_labels(ich_labels, rho, eta_l, eta_u, seed):
    y = ich_labels
    n, k = y.size, 20
    rs = np.random.RandomState(100)
    owner = rs.randint(0, k, n)
    dict_users = [set(int(i) for i in np.flatnonzero(owner == c)) for c in range(k)]  # set order, like the code
    a = ClientAssignment.from_lists(n, [list(s) for s in dict_users])
    soft = _soft_for(y, 5, seed=seed)
    expected, gamma_s, gamma_c = _official_hidn(y, dict_users, soft, rho, eta_l, eta_u, seed, k, 5)
    res = hidn_noise(y, a, rho, eta_l, eta_u, soft, seed, num_classes=5)
    np.testing.assert_array_equal(res.given, expected)
    np.testing.assert_array_equal(res.client_level, gamma_c)
    assert res.noisy_clients() == [int(i) for i in np.flatnonzero(gamma_s)]
    assert fednoro_noisy_clients(k, rho, seed) == res.noisy_clients()
    for c in res.noisy_clients():
        idx = a.clients[c]
        assert res.is_noisy[idx].sum() == int(gamma_c[c] * idx.size)


def test_hidn_matches_replay_with_100_classes_and_nan_rows_of_clean_clients():
    rs = np.random.RandomState(4)
    n, k, c = 3000, 10, 100
    y = rs.randint(0, c, n).astype(np.int64)
    perm = rs.permutation(n)
    dict_users = [set(int(i) for i in perm[j * 300 : (j + 1) * 300]) for j in range(k)]
    a = ClientAssignment.from_lists(n, [list(s) for s in dict_users])
    soft = _soft_for(y, c, seed=5, sharp=20.0)
    expected, _, gamma_c = _official_hidn(y, dict_users, soft, 0.5, 0.5, 0.7, 3, k, c)
    masked = soft.copy()
    for j in np.flatnonzero(gamma_c == 0):
        masked[list(dict_users[j])] = np.nan  # rows of clean clients are never read
    res = hidn_noise(y, a, 0.5, 0.5, 0.7, masked, 3, num_classes=c)
    np.testing.assert_array_equal(res.given, expected)


def test_hidn_hand_case_two_classes():
    # One client, 4 samples; p_t = 1 for the first two -> weight 0, so the two flips
    # (eta = 0.5 -> M = 2) must be positions 2 and 3; with 2 classes the new label is forced.
    y = np.array([0, 1, 0, 1], dtype=np.int64)
    soft = np.array([[1.0, 0.0], [0.0, 1.0], [0.2, 0.8], [0.6, 0.4]])
    a = ClientAssignment.from_lists(4, [[0, 1, 2, 3]])
    res = hidn_noise(y, a, rho=1.0, eta_l=0.5, eta_u=0.5, soft_labels=soft, seed=0, num_classes=2)
    np.testing.assert_array_equal(res.given, [0, 1, 1, 0])
    assert res.client_level.tolist() == [0.5]


def test_hidn_guards():
    # Saturated annotator: every p_t = 1 -> numpy would refuse (no non-zero weight);
    # the guard adds 1e-12 (uniform choice). Rows with no mass off the true class -> uniform other class.
    y = np.array([0, 1, 2, 0, 1, 2], dtype=np.int64)
    soft = np.eye(3)[y]
    a = ClientAssignment.from_lists(6, [range(6)])
    res = hidn_noise(y, a, 1.0, 0.5, 0.5, soft, seed=0, num_classes=3)
    assert res.is_noisy.sum() == 3
    assert (res.given[res.is_noisy] != y[res.is_noisy]).all()
    w = misclassification_weights(np.array([1.0, 1.0, 0.5]), 2)
    assert (w > 0).all() and np.isclose(w.sum(), 1.0)
    w_clip = misclassification_weights(np.array([1.0000001, 0.5, 0.5]), 2)
    assert w_clip[0] == 0 and np.isclose(w_clip.sum(), 1.0)
    # no guard when not needed: exactly (1 - p_t) / sum
    p_t = np.array([0.2, 0.6])
    np.testing.assert_array_equal(misclassification_weights(p_t, 1), (1 - p_t) / (1 - p_t).sum())


def test_draw_other_labels_equals_per_sample_choice():
    rs = np.random.RandomState(0)
    for c in (2, 5, 14, 100):
        rows = rs.dirichlet(np.ones(c) * 0.5, size=200)
        true = rs.randint(0, c, 200)
        got = draw_other_labels(np.random.RandomState(7), rows, true)
        ref = np.random.RandomState(7)
        want = []
        for q, t in zip(rows.copy(), true):
            q[t] = 0
            q = q / q.sum()
            want.append(ref.choice(np.arange(c), p=q))
        np.testing.assert_array_equal(got, want)
        assert (got != true).all()


def test_hidn_input_errors():
    y = np.zeros(4, dtype=np.int64)
    a = ClientAssignment.from_lists(4, [range(4)])
    with pytest.raises(DataError, match="soft_labels"):
        hidn_noise(y, a, 1.0, 0.5, 0.5, np.ones((4, 3)), 0, num_classes=2)
    with pytest.raises(DataError, match="noisy client 0"):
        hidn_noise(y, a, 1.0, 0.5, 0.5, np.full((4, 2), np.nan), 0, num_classes=2)
    with pytest.raises(DataError, match="soft_labels"):
        FedNoRoHIDN(rho=1.0, eta_l=0.5, eta_u=0.5).run(y, a, 2, 0)


def test_fednoro_noisy_clients_agrees_with_spec_and_counts():
    spec = FedNoRoHIDN(rho=0.3, eta_l=0.5, eta_u=0.7)
    for seed in range(5):
        got = fednoro_noisy_clients(20, 0.3, seed)
        assert got == spec.noisy_clients(20, seed)
        assert len(got) == 6 and got == sorted(got)
