"""Hypothesis properties of every noise model: exact counts, bounds, untouched clean clients, determinism."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fnlcore.assignment import ClientAssignment
from fnlcore.io import write_parquet
from fnlcore.noise import (
    FedCorrNoise,
    FedGRNoise,
    FedMLPPartial,
    FedNCLBernoulli,
    FedNCLGaussian,
    FedNoRoHIDN,
    SymmetricNoise,
    AsymmetricNoise,
    noise_frame,
    transition_counts,
)

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw, min_n=1, max_n=300, max_k=8, min_c=2, max_c=12, fixed_c=None):
    """Random labels and a random partition (some samples unassigned, clients possibly empty)."""
    n = draw(st.integers(min_n, max_n))
    k = draw(st.integers(1, max_k))
    c = fixed_c or draw(st.integers(min_c, max_c))
    data_seed = draw(st.integers(0, 2**31 - 1))
    rs = np.random.RandomState(data_seed)
    y = rs.randint(0, c, n).astype(np.int64)
    used = rs.randint(int(0.7 * n), n + 1)
    cuts = np.sort(rs.randint(0, used + 1, k - 1))
    perm = rs.permutation(n)[:used]
    a = ClientAssignment.from_lists(n, np.split(perm, cuts))
    seed = draw(st.integers(0, 2**31 - 1))
    return y, a, c, seed


def _clean_untouched(res, y, a):
    for k in np.flatnonzero(~res.client_noisy):
        idx = a.clients[k]
        np.testing.assert_array_equal(res.given[idx], y[idx])
    client = a.client_of()
    np.testing.assert_array_equal(res.given[client < 0], y[client < 0])


@PROPS
@given(problems(), st.floats(0, 1))
def test_symmetric_exact_count_and_never_keeps_label(p, rate):
    y, a, c, seed = p
    res = SymmetricNoise(rate=rate).run(y, a, c, seed)
    for idx in a.clients:
        assert res.is_noisy[idx].sum() == int(rate * idx.size)
    assert res.given.min() >= 0 and res.given.max() < c
    _clean_untouched(res, y, a)
    incl = SymmetricNoise(rate=rate, include_true=True).run(y, a, c, seed)
    for idx in a.clients:
        assert incl.is_noisy[idx].sum() <= int(rate * idx.size)


@PROPS
@given(problems(), st.floats(0, 1))
def test_asymmetric_cyclic_exact_count(p, rate):
    y, a, c, seed = p
    res = AsymmetricNoise(rate=rate, asym_map="cyclic").run(y, a, c, seed)
    for idx in a.clients:
        assert res.is_noisy[idx].sum() == int(rate * idx.size)
    changed = res.is_noisy
    np.testing.assert_array_equal(res.given[changed], (y[changed] + 1) % c)


@PROPS
@given(problems(), st.sampled_from(["sym", "asym", "mixed"]), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_fedgr_counts(p, noise_type, phi, r1, r2):
    y, a, c, seed = p
    lo, hi = min(r1, r2), max(r1, r2)
    res = FedGRNoise(noise_type, phi, lo, hi, asym_map="cyclic").run(y, a, c, seed)
    assert res.client_noisy.sum() == int(a.num_clients * phi)
    for k in res.noisy_clients():
        idx = a.clients[k]
        rate = res.client_level[k]
        assert lo <= rate <= hi
        assert res.is_noisy[idx].sum() == int(idx.size * rate)  # sym excludes the true class, cyclic always moves
        assert res.client_type[k] in (("sym", "asym") if noise_type == "mixed" else (noise_type,))
    _clean_untouched(res, y, a)


@PROPS
@given(problems(max_n=400), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0.5, 30))
def test_hidn_exact_count_never_true_class(p, rho, e1, e2, sharp):
    y, a, c, seed = p
    lo, hi = min(e1, e2), max(e1, e2)
    rs = np.random.RandomState(seed % 1000)
    alpha = np.ones((y.size, c))
    alpha[np.arange(y.size), y] += sharp
    soft = rs.gamma(alpha)  # a Dirichlet row with extra mass on the true class
    soft /= soft.sum(axis=1, keepdims=True)
    res = FedNoRoHIDN(rho, lo, hi).run(y, a, c, seed, soft_labels=soft)
    assert res.client_noisy.sum() == int(rho * a.num_clients)
    for k in res.noisy_clients():
        idx = a.clients[k]
        assert res.is_noisy[idx].sum() == int(res.client_level[k] * idx.size)
    assert (res.given[res.is_noisy] != y[res.is_noisy]).all()
    _clean_untouched(res, y, a)


def _within_binomial(count: int, n: int, p: float) -> bool:
    """|X - np| <= 6 sd + 1: a failure chance of about 1e-9 per check."""
    return abs(count - n * p) <= 6 * np.sqrt(n * p * (1 - p)) + 1


@PROPS
@given(problems(min_n=500, max_n=3000, max_k=5, fixed_c=10), st.floats(0, 1), st.floats(0, 1))
def test_fedcorr_rates_within_binomial_bound(p, rho, tau):
    y, a, c, seed = p
    res = FedCorrNoise(rho, tau).run(y, a, c, seed)
    for k in range(a.num_clients):
        idx = a.clients[k]
        level = res.client_level[k]
        assert (level == 0) or (tau <= level <= 1)
        assert _within_binomial(int(res.is_noisy[idx].sum()), idx.size, level * 0.9)
    _clean_untouched(res, y, a)


@PROPS
@given(problems(min_n=500, max_n=3000, max_k=5), st.floats(0, 1), st.floats(0, 1), st.floats(0, 0.6))
def test_fedncl_rates_within_binomial_bound(p, pclean, mu, sigma):
    y, a, c, seed = p
    bern = FedNCLBernoulli(pclean).run(y, a, c, seed)
    gauss = FedNCLGaussian(mu, sigma).run(y, a, c, seed)
    for res in (bern, gauss):
        for k in range(a.num_clients):
            idx = a.clients[k]
            assert _within_binomial(int(res.is_noisy[idx].sum()), idx.size, res.client_level[k] * (1 - 1 / c))
        _clean_untouched(res, y, a)
    assert ((gauss.client_level >= 0) & (gauss.client_level <= 1)).all()


@PROPS
@given(problems(max_c=10), st.integers(1, 9))
def test_partial_only_removes_positives_of_missing_classes(p, missing):
    y1, a, c, seed = p
    missing = min(missing, c - 1)
    assume(c - missing > 1 or a.num_clients == c)  # one class per client needs K == C
    y = (np.random.RandomState(seed % 999).rand(y1.size, c) < 0.4).astype(np.uint8)
    res = FedMLPPartial(missing).run(y, a, c, seed)
    assert (res.given <= y).all()
    np.testing.assert_array_equal(res.given, y * res.sample_active)
    assert (res.active_mask.sum(axis=1) == c - missing).all()
    np.testing.assert_array_equal(res.is_noisy, (res.given != y).any(axis=1))


@settings(max_examples=8, deadline=None)
@given(problems(max_n=200), st.sampled_from(["fedcorr", "sym", "fedgr"]))
def test_same_seed_same_labels_and_byte_identical_parquet(p, which):
    y, a, c, seed = p
    spec = {
        "fedcorr": FedCorrNoise(0.5, 0.3, label_space="all"),
        "sym": SymmetricNoise(0.4),
        "fedgr": FedGRNoise("mixed", 0.5, 0.2, 0.4),
    }[which]
    r1, r2 = spec.run(y, a, c, seed), spec.run(y, a, c, seed)
    np.testing.assert_array_equal(r1.given, r2.given)
    np.testing.assert_array_equal(r1.client_level, r2.client_level)
    assert transition_counts(r1, y, a, c).sum() == sum(idx.size for idx in a.clients)
    with tempfile.TemporaryDirectory() as d:
        write_parquet(noise_frame(r1, y, a), Path(d) / "1.parquet")
        write_parquet(noise_frame(r2, y, a), Path(d) / "2.parquet")
        assert (Path(d) / "1.parquet").read_bytes() == (Path(d) / "2.parquet").read_bytes()
