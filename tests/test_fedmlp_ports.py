"""FedLSR and FedNoRo as FedMLP's code ports them to multi-label partial labels: hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.fedlsr_ml import FedLSRMLParams, fedlsr_ml_loss, ramp, sharpen_binary
from fnlcore.methods.fednoro_ml import fednoro_ml_loss
from fnlcore.methods.parts import gaussian_ramp_up

from .engine_helpers import make_ctx


def test_binary_sharpening_and_ramp_by_hand():
    # 0.36 / (0.36 + 0.16) = 0.6923; 0.5 stays; symmetric around 0.5
    out = sharpen_binary(torch.tensor([0.6, 0.5, 0.4]))
    assert out.tolist() == pytest.approx([0.36 / 0.52, 0.5, 0.16 / 0.52], abs=1e-6)
    assert [ramp(r, 0.4, 40) for r in (0, 10, 40, 100)] == pytest.approx([0.0, 0.1, 0.4, 0.4])


def test_fedlsr_ml_loss_is_bce_with_logits_on_probabilities():
    # Identical views: JS = 0, p = sigma(z); z = 0 -> p = 0.5 -> p_s = 0.5.
    # BCEwl(0.5, y=1) with pos_weight 2 = 2 log(1 + e^-0.5); BCEwl(0.5, y=0) = log(1 + e^0.5).
    z = torch.zeros(1, 2)
    y = torch.tensor([[1.0, 0.0]])
    pw = torch.tensor([2.0, 3.0])
    loss = fedlsr_ml_loss(z, z, y, pw, torch.tensor(0.3), 0.4, 4, FedLSRMLParams())
    expected = (2 * math.log(1 + math.exp(-0.5)) + math.log(1 + math.exp(0.5))) / (4 * 2)  # / (B C)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # a confident correct p_s = 1 still costs log(1 + e^-1) = 0.3133 per entry: the code's weak signal
    big, half = torch.tensor([[30.0]]), torch.tensor(0.5)
    one = fedlsr_ml_loss(big, big, torch.ones(1, 1), torch.ones(1), half, 0.0, 1, FedLSRMLParams())
    assert one.item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-5)
    paper = fedlsr_ml_loss(big, big, torch.ones(1, 1), torch.ones(1), half, 0.0, 1, FedLSRMLParams(cls_on_probs=False))
    assert paper.item() == pytest.approx(0.0, abs=1e-5)


def test_fedlsr_ml_js_term_is_zero_for_equal_views_and_positive_otherwise():
    y, pw, half = torch.zeros(2, 3), torch.ones(3), torch.tensor(0.5)
    z1 = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
    base = fedlsr_ml_loss(z1, z1, y, pw, half, 0.0, 2, FedLSRMLParams())
    same = fedlsr_ml_loss(z1, z1, y, pw, half, 0.4, 2, FedLSRMLParams())
    assert same.item() == pytest.approx(base.item(), abs=1e-7)
    diff = fedlsr_ml_loss(z1, -z1, y, pw, half, 0.4, 2, FedLSRMLParams())
    no_js = fedlsr_ml_loss(z1, -z1, y, pw, half, 0.0, 2, FedLSRMLParams())
    assert diff.item() > no_js.item()


def test_fednoro_ml_weight_schedule_by_hand():
    # w(r) = 0.8 exp(-5 (1 - (clip(r, 10, 499) - 10) / 489)^2)
    assert gaussian_ramp_up(0, 10, 499, 0.8) == pytest.approx(0.8 * math.exp(-5))
    assert gaussian_ramp_up(10, 10, 499, 0.8) == pytest.approx(0.8 * math.exp(-5))
    assert gaussian_ramp_up(499, 10, 499, 0.8) == pytest.approx(0.8)
    assert gaussian_ramp_up(600, 10, 499, 0.8) == pytest.approx(0.8)
    mid = 10 + 489 / 2
    assert gaussian_ramp_up(mid, 10, 499, 0.8) == pytest.approx(0.8 * math.exp(-1.25))


def test_fednoro_ml_loss_splits_active_and_missing_classes():
    # one sample, classes [annotated, missing]; z = 0, teacher logit 0.8 -> sigma(1) on the missing class
    z = torch.zeros(1, 1, 2)  # K = 1 client, one row
    zt = torch.tensor([[[0.0, 0.8]]])
    y = torch.tensor([[[1.0, 0.0]]])
    active = torch.tensor([[1.0, 0.0]])
    shift = torch.zeros(1, 2)
    w = 0.25
    loss = fednoro_ml_loss(z, zt, y, shift, active, w, 0.8, None)
    mse = (0.5 - 1 / (1 + math.exp(-1.0))) ** 2  # / (b |M_k|) = 1
    bce = math.log(2)  # BCE(sigma(0), 1), / (b |A_k|) = 1
    assert loss.item() == pytest.approx(w * mse + (1 - w) * bce, rel=1e-6)
    # the LA shift moves the annotated class only: log(0.25 / 0.75) with tau = 1
    shifted = fednoro_ml_loss(z, zt, y, torch.tensor([[math.log(1 / 3), 0.0]]), active, 0.0, 0.8, None)
    assert shifted.item() == pytest.approx(-math.log(0.25), rel=1e-6)
    # no missing class: only the supervised term, still scaled by 1 - w
    full = fednoro_ml_loss(z, zt, y, shift, torch.ones(1, 2), w, 0.8, None)
    assert full.item() == pytest.approx((1 - w) * (math.log(2) + math.log(2)) / 2, rel=1e-6)


@pytest.mark.parametrize("name", ["fedlsr_ml", "fednoro_ml"])
def test_ports_train_on_multi_label_data_and_refuse_single_label(name):
    from fnlcore.errors import ConfigError

    settings = TrainSettings(model="tiny", rounds=2, local_epochs=1, batch_size=16, lr=0.05, eval_batch_size=512)
    ctx = make_ctx(settings, seed=0, multi_label=True, missing=2)
    method = METHODS[name](method_from_dict({"name": name}), ctx)
    metrics = Simulation(method, ctx, progress=lambda s: None).run()
    assert len(metrics) == 2 and metrics["bacc"].notna().all()
    with pytest.raises(ConfigError, match="multi-label data only"):
        METHODS[name](method_from_dict({"name": name}), make_ctx(settings, seed=0))
