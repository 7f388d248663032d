"""Hand-computed cases for FedAvg, FedProx, FedLA and FedNoRo's key formulas."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.logit_adjust import la_cross_entropy, log_priors
from fnlcore.methods.fednoro import (
    class_loss_matrix, daagg_weights, detect_noisy_clients, minmax_columns, vote,
)
from fnlcore.methods.parts import gaussian_ramp_up, proximal_term

from .engine_helpers import make_ctx


def _final_state(name, params, seed=0):
    ctx = make_ctx(TrainSettings(rounds=2, local_epochs=1, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.5), seed=seed)
    m = METHODS[name](method_from_dict({"name": name, **params}), ctx)
    df = Simulation(m, ctx, progress=lambda s: None).run()
    return m.global_model.state_dict(), df


def test_fedprox_with_mu_zero_is_fedavg_bit_exactly():
    a, da = _final_state("fedavg", {})
    b, db = _final_state("fedprox", {"mu": 0.0})
    assert all(torch.equal(a[k], b[k]) for k in a)
    c, _ = _final_state("fedprox", {"mu": 1.0})
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_proximal_term_values():
    # baselines.md §2: w - w_g = [1, -2], mu = 0.1 -> 0.25 (squared_half) and 0.2236 (fedcorr_unsquared)
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
    ref = {"weight": torch.zeros(1, 2)}
    params = {n: p.unsqueeze(0) for n, p in model.named_parameters()}  # K = 1 client
    assert float(proximal_term(params, ref, ["weight"], 0.1, "squared_half").detach()) == pytest.approx(0.25)
    t = proximal_term(params, ref, ["weight"], 0.1, "fedcorr_unsquared")
    assert float(t.detach()) == pytest.approx(0.1 * math.sqrt(5), abs=1e-4)
    t.sum().backward()
    assert torch.allclose(model.weight.grad, torch.tensor([[0.0447, -0.0894]]), atol=1e-4)


def test_logit_adjustment_hand_cases():
    z = torch.zeros(2, 2)
    lp = torch.log(torch.tensor([0.8, 0.2]))
    losses = la_cross_entropy(z[:, None], torch.tensor([0, 1]), lp.expand(2, 2), 1.0, None)  # K = 2 of one row
    assert losses.tolist() == pytest.approx([0.2231, 1.6094], abs=1e-4)
    # uniform prior = plain CE
    logits = torch.randn(8, 5)
    y = torch.randint(0, 5, (8,))
    uniform = torch.log(torch.full((1, 5), 0.2))
    assert torch.allclose(la_cross_entropy(logits[None], y, uniform, 1.0, None), F.cross_entropy(logits, y))


def test_log_priors_absent_class_is_minus_inf():
    lp = log_priors(torch.tensor([[3.0, 1.0, 0.0]]))
    assert lp[0, 2] == -math.inf and lp[0, 0] == pytest.approx(math.log(0.75))


def test_ramp_up_values():
    assert gaussian_ramp_up(10, 10, 49, 0.8) == pytest.approx(0.8 * math.exp(-5))
    assert gaussian_ramp_up(49, 10, 49, 0.8) == pytest.approx(0.8)
    assert gaussian_ramp_up(99, 10, 49, 0.8) == pytest.approx(0.8)
    mid = 10 + 39 / 2
    assert gaussian_ramp_up(mid, 10, 49, 0.8) == pytest.approx(0.8 * math.exp(-5 * 0.25))


def test_class_loss_matrix_fill_and_normalisation():
    losses = np.array([1.0, 3.0, 2.0, 4.0, 6.0])
    labels = np.array([0, 0, 1, 0, 0])
    clients = [np.array([0, 1, 2]), np.array([3, 4])]
    mat = class_loss_matrix(losses, labels, clients, 2)
    # client 0: class0 mean 2, class1 2; client 1: class0 5, class1 missing -> column min 2
    assert mat.tolist() == [[2.0, 2.0], [5.0, 2.0]]
    assert minmax_columns(mat).tolist() == [[0.0, 0.0], [1.0, 0.0]]  # constant column -> 0


def test_vote_majority_and_tie_rule():
    a, b, c = frozenset({1}), frozenset({2}), frozenset({1, 2})
    assert vote([a, b, b]) == b
    # fednoro.md §4.2 item 7: ties go to the tied set that first appears (smallest seed)
    assert vote([a, b, b, a, c, c, c, a, b]) == a  # all three reach 3; C reaches it first but A appears first
    assert vote([a, b, b, a]) == a  # a and b tie at 2; a appears first
    assert vote([b, a, a, b]) == b
    assert vote([a, b]) == a
    assert vote([c, a, b, b, a]) == a  # c (count 1) is not tied; a appears before b
    assert vote([c, b, b, a, a, a]) == a  # a clear majority wins regardless of order
    assert vote([b]) == b
    with pytest.raises(ValueError):
        vote([])


def test_gmm_detection_finds_the_high_loss_clients():
    rs = np.random.RandomState(0)
    clean = rs.normal(1.0, 0.05, (8, 5))
    noisy = rs.normal(3.0, 0.05, (3, 5))
    mat = np.vstack([clean[:4], noisy, clean[4:]])
    assert detect_noisy_clients(mat, 9) == frozenset({4, 5, 6})


def test_daagg_weights_on_toy_models():
    sizes = np.array([10.0, 10.0, 20.0])
    d = np.array([0.0, 0.0, 2.0])  # the noisy client is at distance 2 (max) -> exp(-1)
    w = daagg_weights(sizes, d)
    raw = np.array([0.25, 0.25, 0.5 * math.exp(-1)])
    np.testing.assert_allclose(w, raw / raw.sum())
    np.testing.assert_allclose(daagg_weights(sizes, np.zeros(3)), sizes / sizes.sum())


def test_fednoro_detects_the_noisy_client_on_digits():
    ctx = make_ctx(TrainSettings(rounds=4, local_epochs=2, batch_size=16, optimizer="adam", lr=3e-3), noisy_clients=(1,), rate=0.8)
    m = METHODS["fednoro"](method_from_dict({"name": "fednoro", "warmup_rounds": 3}), ctx)
    Simulation(m, ctx, progress=lambda s: None).run()
    res = m.client_results()
    assert res["detected_noisy"].tolist() == [False, True, False, False]
    assert res["true_noisy"].tolist() == [False, True, False, False]


def test_unknown_method_and_keys_are_named():
    with pytest.raises(ConfigError, match="fedavgg"):
        method_from_dict({"name": "fedavgg"})
    with pytest.raises(ConfigError, match="muu"):
        method_from_dict({"name": "fedprox", "muu": 1})
    with pytest.raises(ConfigError, match="distance"):
        method_from_dict({"name": "fednoro", "distance": "l1"})


def test_a_rounds_stage_is_named_by_stage_name_and_the_old_stage_method_is_refused():
    from fnlcore.methods.base import FLMethod

    # "stage" names the Stage type (current_stage(r)); the round's label is stage_name(r)
    old = sorted(n for n in METHODS if any("stage" in vars(c) for c in METHODS[n].__mro__))
    assert not old, f"methods still defining stage(r): {old}"
    with pytest.raises(TypeError, match=r"defines stage\(r\).*stage_name\(r\)"):
        class Renamed(FLMethod):  # noqa: F841 - defining it is the test
            def stage(self, r: int) -> str:
                return "main"
