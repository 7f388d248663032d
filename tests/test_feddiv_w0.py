"""FedDiv's starting filter W(0) against the official code's construction (lijichang/FLNL-FedDiv@918624c).

The code: ``train_data.py`` makes 1,000 points with ``make_blobs(n_samples=1000, n_features=1, centers=2,
random_state=None, shuffle=False)`` at import time (numpy's global state, before ``np.random.seed(args.seed)``),
standardises them (StandardScaler) and min-max scales them; ``server.py`` builds
``gmm.GaussianMixture(X, n_components=2, random_state=args.seed, init_params='random')``, whose parameters are
sklearn's initialisation: responsibilities ``RandomState(args.seed).uniform(size=(1000, 2))``, rows normalised,
one M-step. ``local_data_splitting`` splits the first main round's losses with these parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import datasets, preprocessing
from sklearn.mixture import GaussianMixture

from fnlcore.methods.feddiv import gmm_posteriors, initial_filter, initial_filter_data, training_set

GRID = np.linspace(0.0, 1.0, 1001)


def _code_model(seed: int, X: np.ndarray) -> GaussianMixture:
    """The code's global filter on X: gmm.GaussianMixture.__init__ (init model, then the warm-started one)."""
    init = GaussianMixture(n_components=2, tol=1e-3, covariance_type="full", random_state=seed, init_params="random")
    init._initialize_parameters(X, np.random.RandomState(seed))
    init._set_parameters(init._get_parameters())
    gm = GaussianMixture(n_components=2, weights_init=init.weights_, means_init=init.means_,
                         precisions_init=init.precisions_, tol=1e-3, init_params="random", covariance_type="full",
                         random_state=seed, warm_start=True, max_iter=1)
    gm._initialize_parameters(X, np.random.RandomState(seed))
    gm.covariances_ = init.covariances_
    return gm


@pytest.mark.parametrize("seed", [1, 2, 5, 13])
def test_w0_is_the_codes_gaussian_mixture_initialisation(seed):
    x = initial_filter_data(seed)
    gm = _code_model(seed, x[:, None])
    code_w = np.stack([gm.weights_, gm.means_[:, 0], gm.covariances_[:, 0, 0]])
    np.testing.assert_allclose(initial_filter(seed), code_w, rtol=1e-12, atol=1e-15)
    # and the split of the first main round is the code's predict_proba column of the smaller mean, > 0.5
    losses = np.random.RandomState(seed).rand(500)
    r_clean, clean = gmm_posteriors(losses, initial_filter(seed))
    code_r = gm.predict_proba(losses[:, None])[:, gm.means_.argmin()]
    np.testing.assert_allclose(r_clean, code_r, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(clean, code_r > 0.5)


def test_blobs_are_the_codes_call_on_a_stream_independent_of_the_responsibilities():
    seed = 3
    stream = np.random.RandomState(np.random.MT19937(np.random.SeedSequence(seed, spawn_key=(0,))))
    data, labels = datasets.make_blobs(n_samples=1000, n_features=1, centers=2, random_state=stream, shuffle=False)
    data = preprocessing.StandardScaler().fit(data).transform(data)
    code_x = ((data - min(data)) / (max(data) - min(data)))[:, 0]
    np.testing.assert_allclose(initial_filter_data(seed), code_x, rtol=0, atol=1e-15)
    assert labels[:500].tolist() == [0] * 500  # shuffle=False: the first 500 points are one blob
    # not the responsibilities' stream RandomState(seed) (the code's blobs are unseeded, so independent of it)
    coupled, _ = datasets.make_blobs(n_samples=1000, n_features=1, centers=2, random_state=seed, shuffle=False)
    coupled = preprocessing.StandardScaler().fit(coupled).transform(coupled)
    assert not np.allclose(initial_filter_data(seed), ((coupled - coupled.min()) / np.ptp(coupled))[:, 0])
    np.testing.assert_array_equal(initial_filter(seed), initial_filter(seed))  # reproducible


def test_share_of_seeds_whose_w0_calls_every_loss_noisy_is_the_codes():
    """Measured over 5,000 seeds: the code (args.seed = s, unseeded blobs) 13.8 %, this W(0) 13.1 % call all of
    [0, 1] noisy (and about as many all clean): two near-identical components put the decision boundary at
    mid + var * log(pi_c / pi_n) / (mu_n - mu_c), often outside [0, 1]."""
    noisy = clean = 0
    seeds = range(1, 401)
    for s in seeds:
        c = gmm_posteriors(GRID, initial_filter(s))[1]
        noisy += not c.any()
        clean += c.all()
    assert 0.08 <= noisy / len(seeds) <= 0.20 and 0.08 <= clean / len(seeds) <= 0.20


def test_an_all_noisy_w0_trains_nothing_in_a_clients_first_participation():
    """Why a first main round can train no client (the code's rule too): delta_hat = 1 and, before the 5th
    participation, the training set is the (empty) clean set; |D_hat| <= B means no local training."""
    seed = next(s for s in range(1, 200) if not gmm_posteriors(GRID, initial_filter(s))[1].any())
    w = initial_filter(seed)
    _, clean_np = gmm_posteriors(np.random.RandomState(0).rand(500), w)
    assert not clean_np.any()
    clean = torch.as_tensor(clean_np)
    train, _ = training_set(clean, clean, clean, delta_hat=1.0, count=0)
    assert int(train.sum()) == 0
