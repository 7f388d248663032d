"""FedMLP (fedmlp.md) and the engine's multi-label default: hand-computed cases and short runs."""

from __future__ import annotations

import math

import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.data import FederatedData, ImageSource
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.base import client_pos_weights, partial_bce

from .engine_helpers import make_ctx


# -- the engine's multi-label default (FedMLP's FedAvg loss, fedmlp.md §6) ------------------------


def test_partial_bce_all_classes_and_active_classes_by_hand():
    z = torch.tensor([[0.0, 2.0]])
    y = torch.tensor([[1.0, 0.0]])
    pw = torch.tensor([2.0, 1.0])
    # class 0: 2 * -log sigma(0) = 2 ln 2 = 1.386294; class 1: -log(1 - sigma(2)) = log(1 + e^2) = 2.126928
    assert partial_bce(z, y, pw, batch_size=2).item() == pytest.approx(3.513222 / 4, abs=1e-6)  # / (B * C)
    # FedAvg-PL form: class 0 only, / (B * |A_k|)
    assert partial_bce(z, y, pw, batch_size=2, classes=torch.tensor([1.0, 0.0])).item() == pytest.approx(0.693147, abs=1e-6)


def test_client_pos_weights_are_size_over_true_positives_and_one_without_positives():
    dev = torch.device("cpu")
    y = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.float32)
    img = ImageSource(dev, images=torch.zeros(5, 2, 2, 1, dtype=torch.uint8).numpy())
    data = FederatedData(img, img, y, y * 0, y, [torch.arange(4), torch.tensor([4])], 3, multi_label=True)
    pw = client_pos_weights(data)  # given labels are all 0: the TRUE counts set the weights
    assert pw.tolist() == [[4.0, 2.0, 1.0], [1.0, 1.0, 1.0]]


def test_fedavg_multi_label_default_loss_masks_missing_classes_and_uses_nominal_batch():
    ctx = make_ctx(multi_label=True, missing=2)
    m = METHODS["fedavg"](method_from_dict({"name": "fedavg"}), ctx)
    k = 0
    idx = ctx.data.clients[k][:3]
    logits = torch.zeros(3, 4)

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return logits

    loss = m.loss(Fixed(), torch.zeros(3, 1, 8, 8), idx, 0, k, 0)
    # zero logits: every entry costs ln 2, a positive one pw * ln 2; the missing classes count as 0
    y = ctx.data.y_true[idx] * ctx.data.active[idx]
    pw = m.pos_weights()[k]
    expected = ((y * pw + (1 - y)) * math.log(2)).sum() / (ctx.settings.batch_size * 4)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert ctx.data.active[idx].sum() == 3 * 2  # client 0 annotates 2 of 4 classes


def test_a_single_label_method_on_multi_label_data_is_a_config_error():
    ctx = make_ctx(multi_label=True)
    with pytest.raises(ConfigError, match="'fedprox'.*single-label data only.*multi-label.*fedavg"):
        METHODS["fedprox"](method_from_dict({"name": "fedprox", "mu": 0.01}), ctx)
