"""RHFL (CCR + SCE) and FedLSR (self-regularisation) on the hand cases of baselines.md §6-§7, and short runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.fedlsr import FedLSRParams, fedlsr_loss, sharpen_square
from fnlcore.methods.parts import linear_ramp
from fnlcore.methods.rhfl import ccr_aggregation_weights
from fnlcore.methods.self_regularisation import js_elementwise
from fnlcore.methods.symmetric_ce import LOG_ZERO, sce_per_sample

from .engine_helpers import make_ctx


def test_ccr_weights_hand_case():
    w = ccr_aggregation_weights(np.array([1.0, 1.0, 1.0]), np.array([0.5, 0.8, 1.0]), beta_c=0.5)
    assert w == pytest.approx([0.4147, 0.3072, 0.2780], abs=1e-4)


def test_ccr_uniform_when_qualities_equal_or_no_history():
    assert ccr_aggregation_weights(np.array([2.0, 1.0]), np.array([1.0, 0.5]), 0.5) == pytest.approx([0.5, 0.5])
    assert ccr_aggregation_weights(np.full(4, np.nan), np.array([1.0, 2.0, 3.0, 4.0]), 0.5) == pytest.approx([0.25] * 4)
    # sum q ~ 0 (one improves, one worsens by the same share): the guard gives uniform weights
    assert ccr_aggregation_weights(np.array([2.0, 1.0]), np.array([1.0, 2.0]) * np.array([1.0, 1.0]), 0.5).sum() == pytest.approx(1)


def test_symmetric_ce_reverse_term():
    big = 50.0
    sure = torch.tensor([[big, -big]])  # p_y = 1
    half = torch.tensor([[0.0, 0.0]])  # p_y = 0.5
    y, log_zero = torch.tensor([0]), LOG_ZERO["code"]  # RHFL's clamps: the official code's log 0
    assert sce_per_sample(sure, y, 0.0, 1.0, log_zero).item() == pytest.approx(0.0, abs=1e-5)
    assert sce_per_sample(half, y, 0.0, 1.0, log_zero).item() == pytest.approx(4.6052, abs=1e-4)
    assert sce_per_sample(half, y, 1.0, 0.0, log_zero).item() == pytest.approx(math.log(2))


def test_fedlsr_hand_cases():
    assert sharpen_square(torch.tensor([[0.6, 0.4]])).tolist()[0] == pytest.approx([0.6923, 0.3077], abs=1e-4)
    assert linear_ramp(5, 0.4, 20) == pytest.approx(0.1) and linear_ramp(20, 0.4, 20) == 0.4
    q = torch.softmax(torch.randn(4, 3), 1)
    assert js_elementwise(q, q).item() == pytest.approx(0.0, abs=1e-7)  # xlogy rounding only
    # code-faithful L_cls for p_s = one-hot(y), C = 2: CE of the probabilities as logits
    z = torch.tensor([[60.0, -60.0]])
    p, lam = FedLSRParams(lambda_e=0.0, gamma=0.0), torch.tensor(0.3)
    assert fedlsr_loss(z, z, torch.tensor([0]), lam, 0.0, p).item() == pytest.approx(-math.log(math.e / (math.e + 1)), abs=1e-4)
    paper = FedLSRParams(lambda_e=0.0, gamma=0.0, cls_on_probs=False)
    assert fedlsr_loss(z, z, torch.tensor([0]), lam, 0.0, paper).item() == pytest.approx(0.0, abs=1e-5)


def test_identical_views_make_p_independent_of_lambda():
    z = torch.randn(5, 4)
    y = torch.randint(0, 4, (5,))
    p = FedLSRParams()
    low, high = fedlsr_loss(z, z, y, torch.tensor(0.1), 0.4, p), fedlsr_loss(z, z, y, torch.tensor(0.9), 0.4, p)
    assert low.item() == pytest.approx(high.item())


@pytest.mark.parametrize("spec", [{"name": "rhfl"}, {"name": "rhfl", "local_loss": "ce"}, {"name": "fedlsr", "t_w": 2}])
def test_short_runs_learn(spec):
    settings = TrainSettings(rounds=3, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    ctx = make_ctx(settings)
    method = METHODS[spec["name"]](method_from_dict(spec), ctx)
    m = Simulation(method, ctx, progress=lambda s: None).run()
    assert len(m) == 3 and m["acc"].iloc[-1] > 0.3
