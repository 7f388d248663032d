"""FedNoRo Table 3's detection indicators and scores on cases whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.fednoro_detection import detection_scores, gmm_detection_rates

from .engine_helpers import make_ctx


def test_detection_scores_hand_cases():
    truth = np.array([1, 1, 0, 0, 0], bool)
    assert detection_scores(np.array([1, 1, 0, 0, 0], bool), truth) == (1.0, 1.0, 1.0)
    assert detection_scores(np.array([1, 0, 1, 1, 0], bool), truth) == pytest.approx((0.5, 1 / 3, 0.0))
    assert detection_scores(np.zeros(5, bool), truth) == (0.0, 0.0, 0.0)  # precision 0 when nothing detected


def test_separated_indicators_are_found_by_every_fit():
    feats = np.array([[0.1], [0.12], [0.11], [0.9], [0.95], [0.1], [0.13]])
    truth = np.array([0, 0, 0, 1, 1, 0, 0], bool)
    assert gmm_detection_rates(feats, truth, seeds=20) == (1.0, 1.0, 1.0)
    # confidence: the noisy clients are the LOW component
    assert gmm_detection_rates(1 - feats, truth, seeds=20, noisy_high=False) == (1.0, 1.0, 1.0)
    assert gmm_detection_rates(1 - feats, truth, seeds=20, noisy_high=True) == (0.0, 0.0, 0.0)


def _detect(indicator, extra):
    settings = TrainSettings(rounds=3, local_epochs=2, batch_size=16, optimizer="adam", lr=3e-3)
    ctx = make_ctx(settings, noisy_clients=(0,), rate=0.9)
    spec = method_from_dict({"name": "fednoro_detection", "indicator": indicator, "gmm_seeds": 5, **extra})
    method = METHODS["fednoro_detection"](spec, ctx)
    return Simulation(method, ctx, progress=lambda s: None).run(), method


@pytest.mark.parametrize("indicator,extra", [("loss", {"per_class": True, "norm": True, "logit_adjust": True}),
                                             ("loss", {}), ("conf", {})])
def test_loss_and_confidence_find_the_heavily_noisy_client(indicator, extra):
    # client 0 has 90% flipped labels, the others none
    m, _ = _detect(indicator, extra)
    last = m.iloc[-1]
    assert last["det_recall"] == 1.0 and last["det_precision"] == 1.0 and last["det_mr"] == 1.0
    assert m["det_recall"].iloc[:-1].isna().all()  # logged once, at the last round


def test_lid_indicator_is_fedcorrs_client_mean_lid():
    """LID does not separate this case (Table 3 reports it as a weak indicator too): check the values instead."""
    import torch
    from fnlcore.fl.local import predict
    from fnlcore.methods.fedcorr import lid_scores

    m, method = _detect("lid", {"lid_k": 5})
    ctx = method.ctx
    probs = torch.softmax(predict(ctx, method.global_model, ctx.data.train, ctx.data.clients[1], augment=False), 1)
    assert method.features.shape == (4, 1) and np.isfinite(method.features).all()
    assert 0 <= m["det_recall"].iloc[-1] <= 1 and 0 <= m["det_mr"].iloc[-1] <= 1
    # with augmentation off, client 1's indicator is the mean LID of its softmax outputs
    from fnlcore.methods.noisy_client_detection import client_indicators

    feats = client_indicators(ctx, method.global_model, "lid", augment=False, lid_k=5)
    assert feats[1, 0] == pytest.approx(float(lid_scores(probs, 5).mean()))
