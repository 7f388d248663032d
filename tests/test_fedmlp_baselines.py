"""FedAvg-PL and FedFixMatch as FedMLP adapts them (baselines.md §14, §16): hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.base import partial_bce
from fnlcore.methods.fedfixmatch import confident_pseudo_labels, unsupervised_loss

from .engine_helpers import make_ctx


class _Logits(torch.nn.Module):
    """A 'model' whose output is a fixed leaf tensor (to read the gradient per logit)."""

    def __init__(self, z):
        super().__init__()
        self.z = z

    def forward(self, x):
        return self.z


def test_fedavg_pl_gives_missing_classes_no_gradient_and_matches_the_hand_value():
    ctx = make_ctx(multi_label=True, missing=2)
    m = METHODS["fedavg_pl"](method_from_dict({"name": "fedavg_pl"}), ctx)
    k = 1  # annotates classes 1 and 2 (engine_helpers.active_classes)
    idx = ctx.data.clients[k][:2]
    z = torch.zeros(2, 4, requires_grad=True)
    loss = m.loss(_Logits(z), torch.zeros(2, 1, 8, 8), idx, 0, k, 0)
    loss.backward()
    assert z.grad[:, [0, 3]].abs().sum() == 0 and z.grad[:, [1, 2]].abs().sum() > 0
    y = ctx.data.y_true[idx][:, [1, 2]]
    pw = m.pos_weights()[k, [1, 2]]
    expected = ((y * pw + (1 - y)) * math.log(2)).sum() / (ctx.settings.batch_size * 2)  # / (B |A_k|)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_fedavg_pl_with_every_class_annotated_is_fedavg():
    z = torch.tensor([[0.5, -1.0, 2.0]])
    y = torch.tensor([[1.0, 0.0, 1.0]])
    pw = torch.tensor([2.0, 3.0, 1.5])
    assert partial_bce(z, y, pw, 4, classes=torch.ones(3)).item() == pytest.approx(partial_bce(z, y, pw, 4).item())


def test_fixmatch_confident_set_and_hard_labels_by_hand():
    missing = torch.tensor([1.0, 0.0])
    p = torch.tensor([[0.9, 0.5], [0.5, 0.5], [0.1, 0.99]])
    conf, hard = confident_pseudo_labels(p, missing, 0.8, 0.2)
    assert conf.tolist() == [True, False, True]  # the annotated class 1 does not matter
    assert hard[:, 0].tolist() == [1.0, 0.0, 0.0]
    conf, _ = confident_pseudo_labels(torch.tensor([[0.9, 0.5]]), torch.tensor([1.0, 1.0]), 0.8, 0.2)
    assert conf.tolist() == [False]  # must be confident on EVERY missing class


def test_fixmatch_unsupervised_loss_by_hand():
    z = torch.tensor([[0.0, 2.0], [1.0, 1.0]])
    hard = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    missing = torch.tensor([0.0, 1.0])
    # only sample 0, only class 1: BCE(2, 0) = log(1 + e^2) / (|I| = 1 * |M| = 1)
    assert unsupervised_loss(z, hard, torch.tensor([True, False]), missing).item() == pytest.approx(2.126928, abs=1e-6)
    both = unsupervised_loss(z, hard, torch.tensor([True, True]), missing).item()
    assert both == pytest.approx((2.126928 + 1.313262) / 2, abs=1e-6)  # + log(1 + e^1)
    assert unsupervised_loss(z, hard, torch.tensor([False, False]), missing).item() == 0.0
    assert unsupervised_loss(z, hard, torch.tensor([True, True]), torch.zeros(2)).item() == 0.0


def test_fixmatch_client_index_pos_weight_is_the_codes():
    ctx = make_ctx(multi_label=True, missing=3)
    m = METHODS["fedfixmatch"](method_from_dict({"name": "fedfixmatch", "unsup_pos_weight": "client_index"}), ctx)
    w = m._unsup_pos_weight(2)
    assert w.tolist() == [1.0, 1.0, m.pos_weights()[2, 2].item(), 1.0]
    assert METHODS["fedfixmatch"](method_from_dict({"name": "fedfixmatch"}), ctx)._unsup_pos_weight(2) is None


def _run(name, **kw):
    ctx = make_ctx(TrainSettings(rounds=3, local_epochs=1, batch_size=32, optimizer="adam", lr=3e-3), multi_label=True)
    return Simulation(METHODS[name](method_from_dict({"name": name, **kw}), ctx), ctx, progress=lambda s: None).run()


def test_partial_label_baselines_train_on_multi_label_digits():
    pl = _run("fedavg_pl")
    assert pl["bacc"].notna().all() and pl["bacc"].iloc[-1] > max(pl["bacc"].iloc[0], 0.5)
    # loose confidence bounds so that the unsupervised term acts within three rounds
    fm = _run("fedfixmatch", upper=0.55, lower=0.45)
    share = fm["fixmatch_confident_share"]
    assert fm["bacc"].notna().all() and 0 < share.iloc[-1] <= 1
    assert fm["bacc"].tolist() != pl["bacc"].tolist()  # L_u changed the training
