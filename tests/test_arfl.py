"""ARFL (baselines.md §12): the spec's hand case, the identical-models guard, permutation invariance, a short run."""

import numpy as np
import pytest
import torch

from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.arfl import arfl_aggregate, client_weights, irls_fit, line_at, median, median_line, rank_leverage

from .engine_helpers import make_ctx

HAND = torch.tensor([[1.0, 1.1, 0.9, 1.05, 10.0]], dtype=torch.float64)


def test_median_averages_the_two_middle_values():
    assert float(median(torch.tensor([3.0, 1.0, 2.0, 10.0]))) == 2.5
    assert float(median(torch.tensor([3.0, 1.0, 2.0]))) == 2.0


def test_repeated_median_line_hand_case():
    intercept, slope, ranks = median_line(HAND)
    fitted = line_at(intercept, slope, ranks)
    assert ranks.tolist() == [[1, 3, 0, 2, 4]]
    # a = 0.9, b = 0.075
    assert intercept.tolist() == pytest.approx([0.9]) and slope.tolist() == pytest.approx([0.075])
    assert torch.allclose(fitted, torch.tensor([[0.975, 1.125, 0.9, 1.05, 1.2]], dtype=torch.float64))


def test_leverage_equals_the_hat_matrix_diagonal():
    ranks = torch.tensor([[1, 3, 0, 2, 4]])
    x = torch.stack([torch.ones(5, dtype=torch.float64), ranks[0].double()], 1)
    hat = x @ torch.linalg.inv(x.T @ x) @ x.T
    assert torch.allclose(rank_leverage(ranks, 5)[0], torch.diagonal(hat))


def test_irls_hand_case_psi_restricted_values_and_weights():
    fit = irls_fit(HAND, 2.0, 0.1)
    restricted, conf = fit.restricted(HAND), fit.confidence
    assert torch.allclose(restricted, torch.tensor([[1.0, 1.1, 0.9, 1.05, 1.2]], dtype=torch.float64))
    psi = conf / conf[0, 0]  # c_i = psi_i * std(psi) and psi_0 = 1
    assert torch.allclose(psi[0, :4], torch.ones(4, dtype=torch.float64))
    assert float(psi[0, 4]) == pytest.approx(0.0076, abs=2e-4)
    w = client_weights(conf.sum(0))
    assert w.tolist() == pytest.approx([0.25, 0.25, 0.25, 0.25, 0.0], abs=1e-4)


def test_aggregate_of_the_hand_case_is_1_0125():
    states = [{"w": torch.tensor([v])} for v in HAND[0].float().tolist()]
    out, w = arfl_aggregate(states, 2.0, 0.1)
    assert float(out["w"]) == pytest.approx(1.0125, abs=1e-4)
    assert out["w"].dtype == torch.float32 and out["w"].shape == (1,)


def _states(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {"conv": torch.randn(3, 2, generator=g), "bias": torch.randn(4, generator=g),
         "scalar": torch.randn((), generator=g), "bn.num_batches_tracked": torch.tensor(7 + i)}
        for i in range(n)
    ]


def test_identical_models_return_that_model():
    s = _states(1)[0]
    out, w = arfl_aggregate([s] * 5, 2.0, 0.1)
    assert torch.allclose(w, torch.full((5,), 0.2, dtype=torch.float64))
    for k in s:
        assert torch.allclose(out[k].double(), s[k].double()), k


def test_permutation_invariance_and_buffer_conventions():
    states = _states()
    out, w = arfl_aggregate(states, 2.0, 0.1, chunk_elements=40)  # several chunks per tensor
    perm = [3, 0, 5, 1, 4, 2]
    out_p, w_p = arfl_aggregate([states[i] for i in perm], 2.0, 0.1)
    assert torch.allclose(w_p, w[perm])
    for k in ("conv", "bias", "scalar"):
        assert torch.allclose(out[k], out_p[k], atol=1e-6), k
    # 0-dim floats: average with the ARFL weights; integer buffers: the first client's value
    expect = sum(float(wi) * float(s["scalar"]) for wi, s in zip(w, states))
    assert float(out["scalar"]) == pytest.approx(expect, abs=1e-6)
    assert int(out["bn.num_batches_tracked"]) == 7 and int(out_p["bn.num_batches_tracked"]) == 10
    assert list(out) == list(states[0])


def test_an_outlier_client_is_down_weighted():
    states = [{"w": torch.tensor([1.0, 2.0, 3.0]) + 0.01 * i} for i in range(5)]
    states.append({"w": torch.tensor([50.0, -40.0, 90.0])})
    out, w = arfl_aggregate(states, 2.0, 0.1)
    assert float(w[-1]) < 0.01
    assert torch.allclose(out["w"], torch.tensor([1.02, 2.02, 3.02]), atol=0.05)


def test_two_clients_fall_back_to_the_uniform_mean():
    out, w = arfl_aggregate([{"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0])}], 2.0, 0.1)
    assert float(out["w"]) == 2.0 and w.tolist() == [0.5, 0.5]


def test_short_run_learns_and_reports_client_weights():
    s = TrainSettings(rounds=2, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    ctx = make_ctx(s, seed=0)
    m = METHODS["arfl"](method_from_dict({"name": "arfl"}), ctx)
    df = Simulation(m, ctx, progress=lambda s: None).run()
    assert len(df) == 2 and np.isfinite(df["acc"]).all() and df["acc"].iloc[-1] > 0.3
    assert (df["arfl_min_weight"] <= df["arfl_max_weight"]).all()
    res = m.client_results()
    assert list(res["times_selected"]) == [2, 2, 2, 2]
    assert res["mean_arfl_weight"].sum() == pytest.approx(1.0)
