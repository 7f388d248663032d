"""RoFL (baselines.md §5): the spec's 'Test' cases plus hand cases of each pure part and a short run."""

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.parts import linear_ramp
from fnlcore.methods.rofl import (
    aggregate_centroids, class_means, forget_rate_at, keep_counts, nearest_centroid, rofl_loss, update_centroids,
)
from fnlcore.methods.small_loss import small_loss_order

from .engine_helpers import make_ctx


def _update_one(centroids, feats, labels):
    """update_centroids of one client (K = 1) whose rows are all kept."""
    return update_centroids(centroids[None], feats[None], labels[None], torch.ones(1, len(labels), dtype=torch.bool))[0]


def test_centroid_update_hand_cases():
    f = torch.tensor([[1.0, 0.0]])
    y = torch.tensor([0])
    # s = cos([1,0],[1,1]) -> s^2 = 0.5 -> 0.5 [1,0] + 0.5 [1,1] = [1, 0.5]
    assert torch.allclose(_update_one(f, torch.tensor([[1.0, 1.0]]), y), torch.tensor([[1.0, 0.5]]))
    # orthogonal batch mean: s = 0 -> unchanged
    assert torch.allclose(_update_one(f, torch.tensor([[0.0, 1.0]]), y), f)
    # empty class (no sample of class 1 in the batch): f̂ = 0 -> unchanged
    two = torch.tensor([[1.0, 0.0], [0.3, -2.0]])
    out = _update_one(two, torch.tensor([[1.0, 1.0]]), y)
    assert torch.equal(out[1], two[1]) and torch.allclose(out[0], torch.tensor([1.0, 0.5]))
    # rows not kept do not enter the class means
    feats, labels = torch.tensor([[[1.0, 1.0], [0.0, 1.0]]]), torch.tensor([[0, 0]])
    kept = torch.tensor([[True, False]])
    assert torch.allclose(update_centroids(f[None], feats, labels, kept)[0], torch.tensor([[1.0, 0.5]]))


def test_class_means_zero_for_empty_classes():
    feats = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    means = class_means(feats, torch.tensor([0, 0, 2]), 3)
    assert torch.allclose(means, torch.tensor([[2.0, 3.0], [0.0, 0.0], [5.0, 6.0]]))


def test_server_centroids_hand_case():
    # f_G_old = [1,0], clients [1,0] (s=1) and [0,1] (s=0) -> [1,0]
    old = torch.tensor([[1.0, 0.0]])
    clients = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    assert torch.allclose(aggregate_centroids(old, clients), torch.tensor([[1.0, 0.0]]))
    # weights s = [1, 0.6]: (1*[2,0] + 0.6*[3,4]) / 1.6
    clients = torch.tensor([[[2.0, 0.0]], [[3.0, 4.0]]])
    assert torch.allclose(aggregate_centroids(old, clients), torch.tensor([[3.8 / 1.6, 2.4 / 1.6]]))


def test_server_centroids_guard_against_a_vanishing_denominator():
    # s = +1 and -1: Σ s = 0 -> denominator 1, f_G = [1,0] - [-1,0] = [2, 0] (no inf/nan)
    old = torch.tensor([[1.0, 0.0]])
    clients = torch.tensor([[[1.0, 0.0]], [[-1.0, 0.0]]])
    out = aggregate_centroids(old, clients)
    assert torch.isfinite(out).all() and torch.allclose(out, torch.tensor([[2.0, 0.0]]))


def test_schedules():
    rates = [forget_rate_at(t, 0.2, 10) for t in range(12)]
    assert rates[0] == 0.0 and rates[1] == pytest.approx(0.2 / 9) and rates[9] == pytest.approx(0.2)
    assert rates[10] == rates[11] == 0.2
    assert forget_rate_at(0, 0.2, 0) == 0.2
    assert [linear_ramp(t, 1.0, 10) for t in (0, 5, 10, 20)] == [0.0, 0.5, 1.0, 1.0]
    assert linear_ramp(0, 1.0, 0) == 1.0


def _small_loss_indices(losses, forget_rate):
    """The rows one client (K = 1, no padding) keeps, smallest loss first."""
    keep = keep_counts(torch.tensor([losses.numel()]), forget_rate)
    order, kept = small_loss_order(losses[None], keep, None)
    return order[0][kept[0]]


def test_small_loss_selection_keeps_the_eight_lowest_of_ten():
    losses = torch.tensor([5.0, 0.1, 9.0, 0.3, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8])
    sel = _small_loss_indices(losses, 0.2)
    assert sorted(sel.tolist()) == [1, 3, 4, 5, 6, 7, 8, 9]
    assert _small_loss_indices(torch.tensor([1.0]), 0.2).tolist() == [0]  # never an empty selection


def test_nearest_centroid_is_by_cosine_not_distance():
    cents = torch.tensor([[10.0, 0.0], [0.0, 0.1], [0.0, 0.0]])  # a zero centroid scores cosine 0
    feats = torch.tensor([[0.2, 1.0], [5.0, 0.1], [-1.0, -1.0]])
    assert nearest_centroid(feats, cents).tolist() == [1, 0, 2]
    assert nearest_centroid(feats[None], cents[None]).tolist() == [[1, 0, 2]]  # K clients: (K, B, d), (K, C, d)


def _batch(n=10, c=3, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g)
    feats = torch.rand(n, d, generator=g)
    labels = torch.randint(0, c, (n,), generator=g)
    return logits, feats, labels, torch.randn(c, d, generator=g)


class _One(NamedTuple):
    loss: torch.Tensor
    selected: torch.Tensor  # positions in the batch that entered the loss, smallest loss first
    targets: torch.Tensor  # y* of the selected samples
    mask: torch.Tensor  # m_i of the selected samples


def _loss_one(logits, feats, labels, pseudo, cents, forget_rate, lambda_cen, lambda_e, use_pseudo, cen_grad):
    """rofl_loss of one client (K = 1, no padding), read back per selected sample."""
    out = rofl_loss(logits[None], feats[None], labels[None], pseudo[None], cents[None], forget_rate, lambda_cen,
                    lambda_e, use_pseudo, cen_grad, None)
    kept = out.kept[0]
    return _One(out.loss[0], out.order[0][kept], out.targets[0][kept], out.mask[0][kept])


def test_batch_loss_uses_exactly_the_small_loss_samples():
    logits, feats, labels, cents = _batch()
    pseudo = (labels + 1) % 3
    out = _loss_one(logits, feats, labels, pseudo, cents, 0.2, 0.0, 0.0, use_pseudo=False, cen_grad=False)
    ce = F.cross_entropy(logits, labels, reduction="none")
    lowest = torch.sort(ce).indices[:8]
    assert sorted(out.selected.tolist()) == sorted(lowest.tolist())
    assert torch.allclose(out.loss, ce[lowest].mean())
    # before T_pl the target is the given label for every selected sample
    assert torch.equal(out.targets, labels[out.selected])


def test_batch_loss_after_t_pl_takes_pseudo_labels_where_the_centroid_disagrees():
    logits, feats, labels, cents = _batch(seed=1)
    pseudo = (labels + 1) % 3
    out = _loss_one(logits, feats, labels, pseudo, cents, 0.0, 0.0, 0.0, use_pseudo=True, cen_grad=False)
    agree = nearest_centroid(feats[out.selected], cents) == labels[out.selected]
    assert torch.equal(out.mask, agree) and 0 < int(agree.sum()) < 10
    expect = torch.where(agree, labels[out.selected], pseudo[out.selected])
    assert torch.equal(out.targets, expect)


def test_centroid_and_entropy_terms_and_their_gradient_switch():
    logits, feats, labels, cents = _batch(seed=2)
    base = _loss_one(logits, feats, labels, labels, cents, 0.0, 0.0, 0.0, False, False)
    m = base.mask.float()
    sel = base.selected
    l_cen = (m.unsqueeze(1) * (feats[sel] - cents[labels[sel]]) ** 2).sum()  # a sum, not a mean
    p = F.softmax(logits[sel], 1)
    l_e = -(p * p.log()).sum(1).mean()
    full = _loss_one(logits, feats, labels, labels, cents, 0.0, 0.5, 0.8, False, False)
    assert torch.allclose(full.loss, base.loss + 0.5 * l_cen + 0.8 * l_e, atol=1e-6)
    # code default: features detached, L_cen gives no gradient; paper switch: it does
    f1 = feats.clone().requires_grad_(True)
    z1 = logits.clone().requires_grad_(True)
    _loss_one(z1, f1, labels, labels, cents, 0.0, 1.0, 0.0, False, cen_grad=False).loss.backward()
    assert f1.grad is None or torch.count_nonzero(f1.grad) == 0
    f2 = feats.clone().requires_grad_(True)
    _loss_one(logits, f2, labels, labels, cents, 0.0, 1.0, 0.0, False, cen_grad=True).loss.backward()
    assert int(m.sum()) > 0 and torch.count_nonzero(f2.grad) > 0


def test_check_training_rejects_t_pl_beyond_the_run():
    params = method_from_dict({"name": "rofl", "t_pl": 10})
    params.check_training(TrainSettings(rounds=100))
    with pytest.raises(ConfigError, match="t_pl"):
        params.check_training(TrainSettings(rounds=10))


def _run(**kw):
    s = TrainSettings(rounds=2, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    ctx = make_ctx(s, seed=0)
    m = METHODS["rofl"](method_from_dict({"name": "rofl", "t_pl": 1, "forget_ramp_rounds": 2, **kw}), ctx)
    return m, Simulation(m, ctx, progress=lambda s: None).run()


@pytest.mark.parametrize("fg_init", ["random", "round0_mean"])
def test_short_run_learns_and_keeps_finite_centroids(fg_init):
    m, df = _run(fg_init=fg_init)
    assert len(df) == 2 and np.isfinite(df["acc"]).all() and df["acc"].iloc[-1] > 0.3
    assert torch.isfinite(m.f_g).all() and m.f_g.shape == (10, m.global_model.feature_dim)
    assert list(df["forget_rate"]) == pytest.approx([0.0, 0.2])
    assert 0 < df["rofl_mask_rate"].iloc[-1] <= 1
    assert (df["rofl_pseudo_target_rate"].iloc[0] == 0.0)  # round 0 < t_pl: given labels only


def test_f_g_starts_standard_normal_from_the_run_seed():
    a = METHODS["rofl"](method_from_dict({"name": "rofl"}), make_ctx(seed=0))
    b = METHODS["rofl"](method_from_dict({"name": "rofl"}), make_ctx(seed=0))
    c = METHODS["rofl"](method_from_dict({"name": "rofl"}), make_ctx(seed=1))
    assert torch.equal(a.f_g, b.f_g) and not torch.equal(a.f_g, c.f_g)
    assert dataclasses.asdict(a.params)["weighting"] == "uniform"
