"""Shared method building blocks on hand-computed cases."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.parts import (
    MixupDraw, add_proximal, client_table, double_softmax_loss, mixup_cross_entropy, mixup_view, proximal_term,
    sequential_client_groups, true_noise_rates,
)

from .engine_helpers import make_ctx


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


@pytest.mark.parametrize("name, passes", [("fedcorr", "iterations1"), ("feddiv", "warmup_iterations")])
def test_group_passes_come_first_unevaluated_at_the_first_learning_rate(name, passes):
    ctx = make_ctx()  # 4 clients, 4 training rounds
    spec = {"name": name, passes: 2, "frac1": 0.5, **({"rounds1": 1} if name == "fedcorr" else {})}
    m = METHODS[name](method_from_dict(spec), ctx)  # 2 groups of 2 a pass
    assert (m.groups_per_iteration, m.pre_rounds, m.num_rounds()) == (2, 4, 8)
    assert [m.should_evaluate(r) for r in (3, 4)] == [False, True] and [m.lr_round(r) for r in (0, 3, 5)] == [0, 0, 1]
    first = METHODS[name].schedule(m.params, ctx.settings, 4)[0]
    assert (first.rounds, first.clients, first.evaluated) == (4, 2, False)
    with pytest.raises(ConfigError, match=rf"^method '{name}': frac1: fraction 0.1 gives 0 clients per group for K=4"):
        METHODS[name](method_from_dict({**spec, "frac1": 0.1}), ctx)
    with pytest.raises(ConfigError, match=rf"^method '{name}': frac1: fraction 0.1"):  # `fnl plan` says the same
        METHODS[name].schedule(method_from_dict({**spec, "frac1": 0.1}), ctx.settings, 4)


def test_true_noise_rates_and_the_client_table():
    clients = [torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5]), torch.tensor([], dtype=torch.int64)]
    given, y_true = torch.tensor([0, 1, 1, 1, 0, 0]), torch.tensor([0, 0, 1, 1, 1, 1])
    data = SimpleNamespace(clients=clients, given=given, y_true=y_true)
    assert true_noise_rates(data) == [0.5, 0.5, 0.0]
    assert true_noise_rates(data, data.y_true, empty=math.nan)[:2] == [0.0, 0.0]
    assert math.isnan(true_noise_rates(data, empty=math.nan)[2])
    table = client_table(data, [0.5, 0.25, 0.0], flagged=np.array([True, False, False]))
    assert list(table.columns) == ["client", "n", "noise_rate", "flagged"]
    assert table.values.tolist() == [[0, 2, 0.5, True], [1, 4, 0.25, False], [2, 0, 0.0, False]]


def test_add_proximal_skips_clients_and_returns_the_loss_when_all_skip():
    ref = {"w": torch.zeros(3)}
    sb = SimpleNamespace(parameters=lambda: {"w": torch.tensor([[1.0, 2.0, 2.0], [0.0, 3.0, 4.0]])})
    loss = torch.tensor([1.0, 2.0])
    assert add_proximal(loss, sb, ref, ["w"], 0.5, "fedcorr_unsquared", torch.tensor([True, True])) is loss
    full = add_proximal(loss, sb, ref, ["w"], 0.5, "fedcorr_unsquared", None)
    assert torch.equal(full, loss + proximal_term(sb.parameters(), ref, ["w"], 0.5, "fedcorr_unsquared"))
    assert full.tolist() == [2.5, 4.5]
    mu = torch.tensor([0.5, 2.0])
    assert add_proximal(loss, sb, ref, ["w"], mu, "squared_half", torch.tensor([False, True])).tolist() == [3.25, 2.0]
