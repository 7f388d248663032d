"""FedDiv (feddiv.md): the pure parts on hand-computed cases, then short runs of the method and its variants."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS
from fnlcore.methods.feddiv import (
    FedDivParams,
    aggregate_filters,
    clean_mask,
    debias_prior_update,
    em_steps,
    gmm_posteriors,
    initial_filter,
    label_balance_regulariser,
    m_step,
    minmax_normalise,
    pcs_select,
    training_set,
)

from .engine_helpers import make_ctx

B = torch.tensor


# -- pure parts ----------------------------------------------------------------------------------


def test_minmax_normalise_and_constant_guard():
    np.testing.assert_allclose(minmax_normalise(np.array([2.0, 4.0, 6.0])), [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(minmax_normalise(np.array([3.0, 3.0])), [0.0, 0.0])


def test_gmm_posteriors_pick_the_smaller_mean_as_clean():
    # component 0 has the larger mean: clean is component 1, whatever the order
    w = np.array([[0.5, 0.5], [1.0, 0.0], [1.0, 1.0]])
    r, clean = gmm_posteriors(np.array([0.0, 1.0]), w)
    # N(0;0,1) / (N(0;0,1) + N(0;1,1)) = 1 / (1 + e^-0.5)
    np.testing.assert_allclose(r, [1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(0.5))])
    np.testing.assert_array_equal(clean, [True, False])


def test_clean_threshold_strict_is_code_inclusive_is_paper():
    r = np.array([0.5, 0.6, 0.4])
    np.testing.assert_array_equal(clean_mask(r), [False, True, False])
    np.testing.assert_array_equal(clean_mask(r, inclusive=True), [True, True, False])


def test_m_step_by_hand():
    resp = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    w = m_step(np.array([0.0, 2.0, 5.0]), resp)
    np.testing.assert_allclose(w[0], [2 / 3, 1 / 3])
    np.testing.assert_allclose(w[1], [1.0, 5.0])
    np.testing.assert_allclose(w[2], [1.0 + 1e-6, 1e-6])


def _sklearn_warm_start(x, w, steps):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    gmm = GaussianMixture(2, covariance_type="full", weights_init=w[0], means_init=w[1][:, None],
                          precisions_init=(1 / w[2])[:, None, None], warm_start=True, max_iter=1,
                          reg_covar=1e-6, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(steps):
            gmm.fit(x[:, None])
    return np.stack([gmm.weights_, gmm.means_[:, 0], gmm.covariances_[:, 0, 0]])


@pytest.mark.parametrize("steps", [1, 3])
def test_em_steps_equal_sklearn_warm_start_fitted_n_times(steps):
    rs = np.random.RandomState(0)
    x = minmax_normalise(np.concatenate([rs.normal(0, 1, 200), rs.normal(5, 1.5, 80)]))
    w = np.array([[0.4, 0.6], [0.7, 0.3], [0.05, 0.02]])  # unsorted components, as the code's
    ours = em_steps(x, w, steps)
    np.testing.assert_allclose(ours, _sklearn_warm_start(x, w, steps), rtol=1e-9, atol=1e-12)
    assert not np.allclose(ours, em_steps(x, w, steps + 1))  # each step moves the fit


def test_em_until_converged_is_a_fixed_point():
    rs = np.random.RandomState(1)
    x = minmax_normalise(np.concatenate([rs.normal(0, 1, 300), rs.normal(6, 1, 100)]))
    w = em_steps(x, np.array([[0.5, 0.5], [0.2, 0.8], [0.05, 0.05]]), 0)
    np.testing.assert_allclose(em_steps(x, w, 1), w, atol=1e-3)


def test_aggregate_filters_gamma_and_gamma_squared():
    f = np.array([[[0.2, 0.8], [0.1, 0.6], [0.04, 0.08]], [[0.6, 0.4], [0.3, 0.9], [0.02, 0.10]]])
    sizes = np.array([1, 3])  # gamma = [0.25, 0.75]
    sq = aggregate_filters(f, sizes, "squared")
    np.testing.assert_allclose(sq[0], [0.25 * 0.2 + 0.75 * 0.6, 0.25 * 0.8 + 0.75 * 0.4])
    np.testing.assert_allclose(sq[1], [0.25 * 0.1 + 0.75 * 0.3, 0.25 * 0.6 + 0.75 * 0.9])
    np.testing.assert_allclose(sq[2], [0.0625 * 0.04 + 0.5625 * 0.02, 0.0625 * 0.08 + 0.5625 * 0.10])
    lin = aggregate_filters(f, sizes, "linear")
    np.testing.assert_allclose(lin[2], [0.25 * 0.04 + 0.75 * 0.02, 0.25 * 0.08 + 0.75 * 0.10])
    np.testing.assert_allclose(lin[:2], sq[:2])


def test_pcs_keeps_samples_whose_global_prediction_equals_the_cached_label():
    clean = B([True, True, False, False])
    cand = B([False, False, True, True])
    pred = B([1, 2, 3, 4])
    ref = B([1, 0, 3, 0])
    c, r = pcs_select(clean, cand, pred, ref)
    assert c.tolist() == [True, False, False, False] and r.tolist() == [False, False, True, False]
    c, r = pcs_select(clean, cand, pred, ref, use_pcs=False)
    assert c.tolist() == clean.tolist() and r.tolist() == cand.tolist()


CLEAN = B([True, True, True, False, False])
C_PRIME = B([True, False, True, False, False])
R_PRIME = B([False, False, False, True, False])


@pytest.mark.parametrize("delta,count,train,relabel", [
    (0.4, 5, [1, 0, 1, 1, 0], [0, 0, 0, 1, 0]),   # cnt >= 5, delta > 0.2: C' u R'
    (0.15, 5, [1, 0, 1, 0, 0], [0, 0, 0, 1, 0]),  # delta <= 0.2: C' only, R' still relabelled
    (0.4, 4, [1, 1, 1, 0, 0], [0, 0, 0, 1, 0]),   # cnt < 5: every clean sample, no PCS
    (0.1, 5, [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]),   # delta <= 0.1: all data, labels unchanged
])
def test_training_set_gates(delta, count, train, relabel):
    t, r = training_set(CLEAN, C_PRIME, R_PRIME, delta, count)
    assert t.int().tolist() == train and r.int().tolist() == relabel


def test_clean_client_rule_lt_is_paper():
    t, r = training_set(CLEAN, C_PRIME, R_PRIME, 0.1, 5, clean_client_rule="lt")
    assert t.int().tolist() == [1, 0, 1, 0, 0] and r.int().tolist() == [0, 0, 0, 1, 0]


def test_debias_prior_update_mask_momentum_and_empty_mask():
    prior = B([0.8, 0.2])
    # sample 0: z - log p = [1 - log .8, .8 - log .2] -> class 1 (de-biasing flips it), q max 0.766 < 0.85
    # sample 1: z - log p = [5 - log .8, 0 - log .2] -> class 0, q max = sigmoid(5.223 - 1.609) = 0.974 > 0.85
    logits = B([[1.0, 0.8], [5.0, 0.0]])
    probs = torch.softmax(logits, 1)
    labels, new = debias_prior_update(logits, probs, prior, xi=1.0, mask_thres=0.85, momentum=0.5)
    assert labels.tolist() == [1, 0]
    torch.testing.assert_close(new, 0.5 * prior + 0.5 * probs[1])
    labels, kept = debias_prior_update(logits[:1], probs[:1], prior, xi=1.0)
    assert labels.tolist() == [1] and torch.equal(kept, prior)
    labels, _ = debias_prior_update(logits[:1], probs[:1], prior, xi=0.0)  # w/o PCS.debias: raw argmax
    assert labels.tolist() == [0]


def test_label_balance_regulariser():
    uniform_mean = torch.log(B([[0.75, 0.25], [0.25, 0.75]]))
    assert abs(float(label_balance_regulariser(uniform_mean[None], None))) < 1e-7  # K = 1 client
    skewed = torch.log(B([[0.75, 0.25], [0.75, 0.25]]))
    # (1/2) [log(.5/.75) + log(.5/.25)] = (1/2) log(4/3)
    assert float(label_balance_regulariser(skewed[None], None)) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)


def test_initial_filter_is_seeded_and_nearly_symmetric():
    a, b, c = initial_filter(0), initial_filter(0), initial_filter(1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and a.shape == (3, 2)
    assert np.all(np.abs(a[0] - 0.5) < 0.05) and abs(a[1, 0] - a[1, 1]) < 0.05  # two near-identical components
    assert np.all(a[2] > 0)


# -- the method ------------------------------------------------------------------------------------

SETTINGS = TrainSettings(rounds=3, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)


def _run(settings=SETTINGS, **kw):
    ctx = make_ctx(settings, seed=0, noisy_clients=(0, 1), rate=0.6)
    kw.setdefault("warmup_iterations", 1)
    method = METHODS["feddiv"](FedDivParams(**kw), ctx)
    return Simulation(method, ctx, progress=lambda s: None).run(), method, ctx


def test_warmup_rounds_then_main_rounds_with_relabels():
    df, m, ctx = _run(participation_gate=1, zeta=0.3)
    assert m.num_rounds() == 4 + 3 and len(df) == 7  # 1 iteration x 4 one-client groups + 3 rounds
    assert df["stage"].tolist() == ["warmup"] * 4 + ["main"] * 3
    assert df["clients"].tolist() == [1] * 4 + [4] * 3
    assert df["acc"].iloc[:4].isna().all() and df["acc"].iloc[4:].notna().all()
    assert m.reported_stages == ("main",)
    rel = ctx.data.relabels.frame()
    assert len(rel) > 0 and set(rel["stage"]) == {"main"} and rel["round"].min() >= 4
    res = m.client_results()
    assert res["participations"].tolist() == [3] * 4 and res["delta_hat"].notna().all()
    assert res["noise_rate"].iloc[2] == 0 and res["noise_rate"].iloc[0] > 0
    assert m.cached.all() and not np.array_equal(m.global_filter, initial_filter(0))


def test_warmup_visits_every_client_once_per_iteration():
    ctx = make_ctx(SETTINGS, seed=0)
    m = METHODS["feddiv"](FedDivParams(warmup_iterations=2), ctx)
    seen = [m.select_clients(r)[0] for r in range(8)]
    assert sorted(seen[:4]) == [0, 1, 2, 3] and sorted(seen[4:]) == [0, 1, 2, 3]


@pytest.mark.parametrize("variant", [
    {"filter": "degraded"},
    {"filter": "local"},
    {"relabel": False, "pcs": False},
    {"pcs": False},
    {"xi": 0.0},
    {"reg_coef": 1.0},
    {"loss_form": "logits", "normalize_losses": False, "clean_posterior": "inclusive", "clean_client_rule": "lt",
     "participation_gate": 0, "relabel_gate": 0.0, "persistent_relabels": False, "prior_mask": 0.0, "xi": 0.5,
     "prior_momentum": 0.2, "variance_weights": "linear", "em_steps": 0, "bn_extra_forward": False,
     "pcs_reference": "local_epoch"},
], ids=["degraded", "local", "no-relab-no-pcs", "no-pcs", "no-debias", "reg", "paper"])
def test_table6_variants_and_paper_switches_run(variant):
    variant = dict(variant)
    s = TrainSettings(rounds=2, local_epochs=2, batch_size=16, optimizer="adam", lr=3e-3, client_fraction=0.5)
    df, m, ctx = _run(s, zeta=0.3, participation_gate=variant.pop("participation_gate", 1), **variant)
    assert len(df) == 6 and df["acc"].iloc[4:].notna().all()
    if variant.get("filter") == "degraded":
        assert m.cached.sum() == 2  # only the last round's two clients
    if variant.get("filter") == "local":
        np.testing.assert_array_equal(m.global_filter, initial_filter(0))
        moved = [not np.array_equal(m.local_filters[k], initial_filter(0)) for k in range(4)]
        assert sum(moved) == int((m.counts > 0).sum())
    if not variant.get("relabel", True) or not variant.get("persistent_relabels", True):
        assert len(ctx.data.relabels) == 0


def test_frac1_must_give_a_client_per_group():
    ctx = make_ctx(SETTINGS, seed=0)
    with pytest.raises(ConfigError, match="frac1"):
        METHODS["feddiv"](FedDivParams(frac1=0.1), ctx)


def test_paper_pcs_reference_relabels_differently_from_the_code():
    s = TrainSettings(rounds=2, local_epochs=2, batch_size=16, optimizer="adam", lr=3e-3)
    _, _, code_ctx = _run(s, zeta=0.3)
    _, m, ctx = _run(s, zeta=0.3, pcs_reference="local_epoch")
    assert m.counts.tolist() == [2] * 4
    assert len(ctx.data.relabels) > 0 and not torch.equal(ctx.data.given, code_ctx.data.given)


def test_resume_in_the_main_phase_equals_an_uninterrupted_run(tmp_path):
    import pandas as pd

    from .test_contracts import assert_same_state

    s = TrainSettings(rounds=3, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3, client_fraction=0.5,
                      checkpoint_every=1)
    params = FedDivParams(warmup_iterations=1, participation_gate=1, zeta=0.3)

    def sim(**kw):
        ctx = make_ctx(s, seed=0, noisy_clients=(0, 1), rate=0.6)
        m = METHODS["feddiv"](params, ctx)
        return Simulation(m, ctx, progress=lambda x: None, **kw), m, ctx

    full_sim, full_m, full_ctx = sim()
    full = full_sim.run()
    sim(checkpoint_path=tmp_path / "c.pt", stop_after=5)[0].run()  # killed after the first main round
    res_sim, res_m, res_ctx = sim(checkpoint_path=tmp_path / "c.pt")
    out = res_sim.run()
    cols = [c for c in full.columns if c != "seconds"]
    pd.testing.assert_frame_equal(out[cols], full[cols], check_exact=True)
    assert_same_state(res_m.state_dict(), full_m.state_dict())
    assert torch.equal(res_ctx.data.given, full_ctx.data.given) and len(full_ctx.data.relabels) > 0
