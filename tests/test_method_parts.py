"""Shared method building blocks on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fnlcore.methods.parts import MixupDraw, double_softmax_loss, mixup_cross_entropy, mixup_view, sequential_client_groups


def test_double_softmax_loss_is_ce_of_probabilities():
    p = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    y = torch.tensor([0, 2])
    want = [-1.0 + math.log(math.e + 2), -0.5 + math.log(math.exp(0.2) + math.exp(0.3) + math.exp(0.5))]
    assert double_softmax_loss(p, y).tolist() == pytest.approx(want)
    # 10 classes: the range FedCorr's GMMs see
    one_hot = torch.eye(10)[:1]
    assert double_softmax_loss(one_hot, torch.tensor([0])).item() == pytest.approx(math.log(math.e + 9) - 1)
    assert double_softmax_loss(one_hot, torch.tensor([1])).item() == pytest.approx(math.log(math.e + 9))


def test_sequential_groups_visit_every_client_once_with_one_per_group():
    groups = sequential_client_groups(np.random.RandomState(3), 10, 0.1)
    assert all(len(g) == 1 for g in groups) and sorted(k for g in groups for k in g) == list(range(10))
    # the same draws as numpy's choice with the renormalised probabilities
    rs, prob, want = np.random.RandomState(3), np.full(10, 0.1), []
    for _ in range(10):
        k = rs.choice(10, 1, p=prob)
        want.append([int(k[0])])
        prob[k] = 0
        prob = prob / prob.sum() if prob.sum() else prob
    assert groups == want


def test_sequential_groups_reject_a_fraction_below_one_client():
    with pytest.raises(ValueError, match="0 clients per group"):
        sequential_client_groups(np.random.RandomState(0), 50, 0.01)


def test_mixup_cross_entropy_matches_a_hand_drawn_mix():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    lam_k, perm_k = (d[None] for d in MixupDraw(1.0)(5, torch.Generator().manual_seed(0), x.device))  # K = 1
    out = model(mixup_view(x, lam_k, perm_k))
    loss = mixup_cross_entropy(out[None], y[None], lam_k, perm_k, None)
    assert out.shape == (5, 3) and loss.shape == (1,) and torch.isfinite(loss).all()
    # the same draw by hand: lambda from the generator's two Gammas, then the permutation
    gen = torch.Generator().manual_seed(0)
    g = torch._standard_gamma(torch.full((2,), 1.0), generator=gen)
    lam = float(g[0] / (g[0] + g[1]))
    perm = torch.randperm(5, generator=gen)
    xm = lam * x + (1 - lam) * x[perm]
    o = model(xm)
    want = lam * torch.nn.functional.cross_entropy(o, y) + (1 - lam) * torch.nn.functional.cross_entropy(o, y[perm])
    assert loss.item() == pytest.approx(want.item())


@pytest.mark.parametrize("k", [49, 50, 93, 98, 99, 100, 500])
def test_default_fraction_is_one_client_per_group_for_every_k(k):
    from fnlcore.methods.parts import group_shape

    assert group_shape(k, None) == (1, k)
    groups = sequential_client_groups(np.random.RandomState(0), k, None)
    assert sorted(g[0] for g in groups) == list(range(k))
