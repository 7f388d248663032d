"""Krum / Multi-Krum, coordinate-wise median and the geometric median (RFA's smoothed Weiszfeld):
hand cases from the papers' definitions, the memory chunking, integer buffers, and engine runs."""

from __future__ import annotations

import math

import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.state import weighted_average
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.geometric_median import geometric_median, weiszfeld
from fnlcore.methods.krum import (
    check_krum,
    krum,
    krum_scores,
    krum_select,
    max_byzantine,
    pairwise_sq_distances,
)
from fnlcore.methods.median import coordinate_median, median_of
from tests.engine_helpers import make_ctx


def _states(points) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor(p, dtype=torch.float32).reshape(-1)} for p in points]


# -- Krum (Blanchard et al. 2017) -----------------------------------------------------------------------


def test_krum_scores_on_five_points_in_one_dimension():
    # n = 5, f = 1: each score sums the n - f - 2 = 2 smallest squared distances to the others.
    # 0: 1 + 4; 1: 1 + 1; 2: 1 + 1; 3: 1 + 4; 100: 97^2 + 98^2 = 9409 + 9604
    st = _states([0.0, 1.0, 2.0, 3.0, 100.0])
    d = pairwise_sq_distances(st)
    assert d[0].tolist() == [0.0, 1.0, 4.0, 9.0, 10000.0] and torch.equal(d, d.T)
    assert krum_scores(d, 1).tolist() == [5.0, 2.0, 2.0, 5.0, 19013.0]
    out, chosen = krum(st, f=1)
    assert chosen == [1] and out["w"].tolist() == [1.0]  # the tie 1 / 2 goes to the earlier client
    out, chosen = krum(st, f=1, multi=2)
    assert chosen == [1, 2] and out["w"].tolist() == [1.5]  # Multi-Krum: the plain mean of the m best


def test_krum_on_five_points_in_two_dimensions():
    # squared distances to the 2 nearest others: (0,0): 1 + 2; (1,0): 1 + 1; (0,2): 2 + 4; (1,1): 1 + 2;
    # (10,10): 162 + 164 -> Krum keeps (1,0); the 3 best are (1,0), then (0,0) and (1,1) tied at 3
    st = _states([[0, 0], [1, 0], [0, 2], [1, 1], [10, 10]])
    assert krum_scores(pairwise_sq_distances(st), 1).tolist() == [3.0, 2.0, 6.0, 3.0, 326.0]
    assert krum(st, f=1)[0]["w"].tolist() == [1.0, 0.0]
    out, chosen = krum(st, f=1, multi=3)
    assert chosen == [1, 0, 3]
    torch.testing.assert_close(out["w"], torch.tensor([2 / 3, 1 / 3]))


def test_krum_never_picks_the_outliers_it_is_told_about():
    g = torch.Generator().manual_seed(0)
    honest = [torch.randn(6, generator=g) * 0.1 for _ in range(7)]
    byz = [torch.full((6,), 50.0), torch.full((6,), -50.0)]
    st = [{"w": v} for v in honest[:3] + byz[:1] + honest[3:] + byz[1:]]
    assert all(i not in (3, 8) for i in krum_select(st, f=2, multi=5))


def test_f_defaults_to_the_most_krum_tolerates_and_bad_settings_name_the_fix():
    assert [max_byzantine(n) for n in (3, 4, 5, 6, 10, 20)] == [0, 0, 1, 1, 3, 8]
    assert check_krum(10, None, 1) == 3 and check_krum(4, 0, 2) == 0
    with pytest.raises(ConfigError, match="at least 3 clients a round"):
        check_krum(2, None, 1)
    with pytest.raises(ConfigError, match=r"f=1 needs n > 2f \+ 2 = 4 clients a round, got n=4.*at most 0"):
        check_krum(4, 1, 1)
    with pytest.raises(ConfigError, match="multi=9 must be at most n - f = 7"):
        check_krum(10, 3, 9)
    with pytest.raises(ConfigError, match="client_fraction"):  # the run's clients per round, checked up front
        METHODS["krum"](method_from_dict({"name": "krum"}), make_ctx(TrainSettings(rounds=1, client_fraction=0.5)))
    assert method_from_dict({"name": "krum"}).slug() == "krum-m1"
    assert method_from_dict({"name": "krum", "f": 2, "multi": 3}).slug() == "krum-f2-m3"


# -- coordinate-wise median (Yin et al. 2018) ----------------------------------------------------------


def test_median_odd_and_even_counts():
    five = torch.tensor([[1.0, 10.0], [2.0, -5.0], [3.0, 0.0], [4.0, 8.0], [100.0, 1.0]])
    assert median_of(five).tolist() == [3.0, 1.0] == median_of(five, "lower").tolist()
    four = torch.tensor([[1.0], [2.0], [4.0], [10.0]])
    assert median_of(four).tolist() == [3.0]  # the mean of the two middle values
    assert median_of(four, "lower").tolist() == [2.0]  # torch.median's lower middle value
    assert median_of(four, "lower").tolist() == [float(four.median(dim=0).values)]
    big = torch.tensor([[3e38], [3e38]], dtype=torch.float32)  # the sum overflows float32, not the float64 mean
    assert median_of(big).dtype == torch.float32 and torch.isfinite(median_of(big)).all()
    assert method_from_dict({"name": "median"}).slug() == "median"
    assert method_from_dict({"name": "median", "even": "lower"}).slug() == "median-lower"


def test_median_over_states_keeps_dtypes_and_takes_integer_buffers_from_the_first_client():
    states = [{"w": torch.tensor([float(v), -float(v)]), "n": torch.tensor(c)} for v, c in ((5, 7), (1, 2), (3, 9))]
    out = coordinate_median(states)
    assert out["w"].tolist() == [3.0, -3.0] and out["n"].dtype == torch.int64 and int(out["n"]) == 7
    perm = [states[i] for i in (2, 0, 1)]
    assert torch.equal(coordinate_median(perm)["w"], out["w"])  # client order does not matter


# -- geometric median by smoothed Weiszfeld (RFA) ------------------------------------------------------


def test_weiszfeld_first_step_by_hand():
    # z0 = the weighted mean 11/3; distances 11/3, 8/3, 19/3; beta_i ~ 1 / d_i; z1 = sum beta_i x_i / sum beta_i
    z, beta, done = weiszfeld(_states([0.0, 1.0, 10.0]), [1, 1, 1], max_iter=1, ftol=0)
    inv = [3 / 11, 3 / 8, 3 / 19]
    assert done == 1 and z["w"].item() == pytest.approx((1 * inv[1] + 10 * inv[2]) / sum(inv), rel=1e-15)
    torch.testing.assert_close(beta, torch.tensor(inv, dtype=torch.float64) / sum(inv))
    z0, beta0, done0 = weiszfeld(_states([0.0, 1.0, 10.0]), [2, 1, 1], max_iter=0)
    assert done0 == 0 and z0["w"].item() == pytest.approx(11 / 4) and beta0.tolist() == [0.5, 0.25, 0.25]


@pytest.mark.parametrize("points, weights, answer", [
    ([0.0, 1.0, 10.0], [1, 1, 1], [1.0]),  # collinear: the middle point
    ([0.0, 1.0, 10.0], [1, 1, 3], [10.0]),  # a point holding more than half the weight
    ([[0.0, 0.0], [1.0, 0.0], [0.5, 0.1]], [1, 1, 1], [0.5, 0.1]),  # an angle > 120 degrees: that vertex
])
def test_weiszfeld_converges_to_the_known_geometric_median(points, weights, answer):
    z, _, _ = weiszfeld(_states(points), weights, max_iter=3000, nu=1e-9, ftol=0)
    torch.testing.assert_close(z["w"], torch.tensor(answer, dtype=torch.float64), atol=1e-6, rtol=0)


def test_equilateral_triangle_is_its_centre_and_the_objective_test_stops():
    c = torch.tensor([1.0, 2.0])
    tri = [c + torch.tensor([math.cos(a), math.sin(a)]) for a in (0.0, 2 * math.pi / 3, 4 * math.pi / 3)]
    z, beta, done = weiszfeld([{"w": t} for t in tri], [1, 1, 1], max_iter=10)
    torch.testing.assert_close(z["w"], c.double())
    assert done == 1  # equal distances: the first step keeps the mean, the objective does not move


def test_size_weights_and_max_iter_zero_is_fedavg():
    g = torch.Generator().manual_seed(1)
    states = [{"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g), "n": torch.tensor(k)}
              for k in range(4)]
    sizes = [10, 30, 20, 40]
    out, _, _ = geometric_median(states, sizes, max_iter=0)
    avg = weighted_average(states, sizes)
    for k in ("w", "b"):
        torch.testing.assert_close(out[k], avg[k], rtol=0, atol=1e-7)
    assert int(out["n"]) == 0  # integer buffers: the first client's


def test_the_geometric_median_resists_one_far_client():
    st = _states([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1000.0, 1000.0]])
    z, beta, _ = weiszfeld(st, [1] * 5, max_iter=50, ftol=0)
    assert float(z["w"].norm()) < 1.5 and float(beta[4]) < 1e-3  # the mean would be (200.4, 200.4)


@pytest.mark.parametrize("chunk", [1, 5, 2**22])
def test_chunks_of_coordinates_change_nothing_but_rounding(chunk, monkeypatch):
    import fnlcore.methods.geometric_median as gm
    import fnlcore.methods.krum as kr
    import fnlcore.methods.median as md

    g = torch.Generator().manual_seed(3)
    states = [{"w": torch.randn(9, 5, generator=g), "b": torch.randn(7, generator=g), "n": torch.tensor(c)}
              for c in range(6)]
    ref_d, ref_m = pairwise_sq_distances(states), coordinate_median(states)
    ref_z = weiszfeld(states, range(1, 7), max_iter=3)[0]
    for mod in (gm, kr, md):
        monkeypatch.setattr(mod, "CHUNK_VALUES", chunk)
    torch.testing.assert_close(pairwise_sq_distances(states), ref_d, rtol=1e-13, atol=0)
    for k in ("w", "b", "n"):
        assert torch.equal(coordinate_median(states)[k], ref_m[k])  # coordinates are independent: bit for bit
    z = weiszfeld(states, range(1, 7), max_iter=3)[0]
    for k in ("w", "b"):
        torch.testing.assert_close(z[k], ref_z[k], rtol=1e-12, atol=1e-13)


def test_integer_buffers_follow_the_krum_pick():
    states = [{"w": torch.tensor([v]), "num_batches_tracked": torch.tensor(10 * i)} for i, v in
              enumerate([0.0, 1.0, 2.0, 3.0, 100.0])]
    out, chosen = krum(states, f=1)
    assert chosen == [1] and int(out["num_batches_tracked"]) == 10
    out, chosen = krum(states, f=1, multi=3)
    assert chosen == [1, 2, 0] and int(out["num_batches_tracked"]) == 10  # the best-scored pick's
    assert out["w"].tolist() == [1.0]


# -- engine runs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, params, column", [
    ("krum", {}, "krum_noisy_share"),
    ("krum", {"multi": 2}, "krum_noisy_share"),
    ("median", {"even": "lower"}, None),
    ("geometric_median", {}, "weiszfeld_iterations"),
])
def test_short_runs_on_digits(name, params, column):
    s = TrainSettings(rounds=2, local_epochs=1, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9)
    ctx = make_ctx(s, seed=0)
    out = Simulation(METHODS[name](method_from_dict({"name": name, **params}), ctx), ctx, progress=lambda x: None).run()
    assert len(out) == 2 and out["acc"].notna().all()
    if column:
        assert out[column].notna().all()


def test_demo_scale_runs_with_noisy_clients():
    """Ten clients, four of them with 60 % wrong labels, as the demo's scale (digits, MLP, Adam)."""
    s = TrainSettings(rounds=2, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    accs = {}
    for name in ("fedavg", "krum", "median", "geometric_median"):
        ctx = make_ctx(s, seed=0, num_clients=10, n_train=1000, noisy_clients=(0, 1, 2, 3))
        out = Simulation(METHODS[name](method_from_dict({"name": name}), ctx), ctx, progress=lambda x: None).run()
        accs[name] = float(out["acc"].iloc[-1])
        if name == "krum":
            assert out["krum_noisy_share"].between(0, 1).all()
        if name == "geometric_median":
            assert out["weiszfeld_iterations"].between(1, 2).all() and out["gm_noisy_weight"].between(0, 1).all()
    assert all(a > 0.3 for a in accs.values()), accs  # ten classes: chance is 0.1


@pytest.mark.parametrize("name, params", [("krum", None), ("median", None), ("geometric_median", None)])
def test_batched_engine_reproduces_the_sequential_engine(name, params):
    """Local training is FedAvg's, batched form included; the server step sees the same states."""
    from tests.test_batched import _assert_same_run, _run

    _assert_same_run(_run(name, "sequential", params), _run(name, "batched", params), 1e-6)
