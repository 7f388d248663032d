"""RoFL on the batched engine: the stacked network's forward_features, the K-client loss and
centroid update against a plain per-client reference written here, and whole runs against the
sequential engine."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from fnlcore.fl.stacked import stacked_input
from fnlcore.methods.rofl import class_means, rofl_loss, update_centroids
from tests.test_batched import MODELS, stacked_and_separate, _assert_same_run, _run


# every layer kind of the backbones (BatchNorm and residual blocks: resnet18_cifar); the forward itself is
# checked on every model in tests/test_batched.py
FEATURE_MODELS = [m for m in MODELS if m[0] in ("mlp", "lenet5", "tiny", "resnet18_cifar")]


@pytest.mark.parametrize("name,channels,size", FEATURE_MODELS)
def test_stacked_forward_features_equals_separate_models_with_padded_rows_and_a_rider(name, channels, size):
    template, net, models, x, rows = stacked_and_separate(name, channels, size)
    k, b = 3, 4
    logits, feats = net.forward_features(stacked_input(x, k), rows)
    assert logits.shape == (k, b, 5) and feats.shape == (k, b, template.feature_dim)
    for i, n_rows in ((0, 4), (1, 3)):
        ref_logits, ref_feats = models[i].forward_features(x[i * b : i * b + n_rows])
        assert torch.allclose(logits[i, :n_rows], ref_logits, rtol=1e-9, atol=1e-9)
        assert torch.allclose(feats[i, :n_rows], ref_feats, rtol=1e-9, atol=1e-9)
        for key, v in net.client_state(i).items():  # BatchNorm statistics moved as the separate model's
            assert torch.allclose(v.double(), models[i].state_dict()[key].double(), rtol=1e-9, atol=1e-12), key
    for key, v in net.client_state(2).items():  # the rider: untouched
        assert torch.equal(v, models[2].state_dict()[key]), key


def _reference_loss(logits, features, labels, pseudo, centroids, forget_rate, lambda_cen, lambda_e, use_pseudo,
                    cen_grad):
    """RoFL's objective on one client's batch, written plainly (§5 step 3): (loss, selected rows
    smallest loss first, their targets, their mask)."""
    per_sample = F.cross_entropy(logits, labels, reduction="none")
    keep = max(int((1.0 - forget_rate) * per_sample.numel()), 1)
    sel = torch.sort(per_sample.detach(), stable=True).indices[:keep]
    z, y = logits[sel], labels[sel]
    phi = features[sel] if cen_grad else features[sel].detach()
    mask = (F.normalize(phi.detach(), dim=1) @ F.normalize(centroids, dim=1).T).argmax(1) == y
    targets = torch.where(mask, y, pseudo[sel]) if use_pseudo else y
    l_c = F.cross_entropy(z, targets)
    l_cen = (mask.unsqueeze(1) * (phi - centroids[y]).pow(2)).sum()
    log_p = F.log_softmax(z, dim=1)
    l_e = -(log_p.exp() * log_p).sum(1).mean()
    return l_c + lambda_cen * l_cen + lambda_e * l_e, sel, targets, mask


def _reference_centroids(centroids, features, labels):
    """§5 step 4 on one client: f[c] <- (1 − s²) f[c] + s² f̂_c over its selected rows."""
    means = class_means(features, labels, centroids.shape[0])
    s2 = F.cosine_similarity(centroids, means, dim=1).pow(2).unsqueeze(1)
    return (1 - s2) * centroids + s2 * means


@pytest.mark.parametrize("use_pseudo,cen_grad", [(False, False), (True, True)])
def test_loss_and_centroid_update_equal_each_client_alone_with_ties_padding_and_a_rider(use_pseudo, cen_grad):
    gen = torch.Generator().manual_seed(4)
    k, b, c, d = 4, 10, 3, 5
    logits = torch.randn(k, b, c, generator=gen, dtype=torch.float64)
    logits[0, 5:] = logits[0, :5]  # tied losses: the stable order decides which rows are kept
    labels = torch.randint(0, c, (k, b), generator=gen)
    labels[0, 5:] = labels[0, :5]
    pseudo = torch.randint(0, c, (k, b), generator=gen)
    centroids = torch.randn(k, c, d, generator=gen, dtype=torch.float64)
    rows = torch.ones(k, b, dtype=torch.bool)
    rows[1, 7:] = False  # a short last batch
    rows[2, 1:] = False  # a batch of one: at least one row is kept
    rows[3] = False  # a rider
    feats = torch.randn(k, b, d, generator=gen, dtype=torch.float64, requires_grad=True)
    out = rofl_loss(logits, feats, labels, pseudo, centroids, 0.25, 0.7, 0.8, use_pseudo, cen_grad, rows)
    y = labels.gather(1, out.order)
    f = feats.detach().gather(1, out.order[:, :, None].expand(k, b, d))
    updated = update_centroids(centroids, f, y, out.kept)
    grads = torch.autograd.grad(out.loss.sum(), feats, allow_unused=True)[0] if cen_grad else None
    assert out.loss[3] == 0 and not out.kept[3].any()  # the rider: no loss, nothing counted
    assert torch.allclose(updated[3], centroids[3])
    for i in range(3):
        n = int(rows[i].sum())
        fi = feats[i, :n].detach().clone().requires_grad_(cen_grad)
        ref_loss, ref_sel, ref_targets, ref_mask = _reference_loss(
            logits[i, :n], fi, labels[i, :n], pseudo[i, :n], centroids[i], 0.25, 0.7, 0.8, use_pseudo, cen_grad)
        assert torch.allclose(out.loss[i], ref_loss, rtol=1e-12, atol=1e-12)
        assert torch.equal(out.order[i][out.kept[i]], ref_sel)  # the same rows, in the same order
        assert torch.equal(out.targets[i][out.kept[i]], ref_targets)
        assert torch.equal(out.mask[i][out.kept[i]], ref_mask) and not out.mask[i][~out.kept[i]].any()
        ref_cent = _reference_centroids(centroids[i], feats[i, :n][ref_sel].detach(), labels[i, :n][ref_sel])
        assert torch.allclose(updated[i], ref_cent, rtol=1e-12, atol=1e-12)
        if cen_grad:
            ref_grad = torch.autograd.grad(ref_loss, fi)[0]
            assert torch.allclose(grads[i, :n], ref_grad, rtol=1e-10, atol=1e-12)
            assert not grads[i, n:].any()  # padded rows add no gradient


def _assert_same_rofl_run(params, **settings):
    a = _run("rofl", "sequential", params, local_epochs=1, **settings)
    b = _run("rofl", "batched", params, local_epochs=1, **settings)
    _assert_same_run(a, b, 1e-6)
    assert torch.allclose(a[1].f_g, b[1].f_g, rtol=1e-4, atol=1e-6)  # the centroids the clients uploaded
    cols = ["forget_rate", "lambda_cen", "rofl_mask_rate", "rofl_pseudo_target_rate"]  # the per-round counters
    assert a[0][cols].to_numpy().ravel().tolist() == pytest.approx(b[0][cols].to_numpy().ravel().tolist(), abs=1e-12)
    assert b[0]["rofl_pseudo_target_rate"].iloc[-1] > 0  # the pseudo-label branch was entered


# rounds 0..2: t_pl = 2 enters the round-0 class means, the ramped centroid weight (round 1, forget rate
# 0.2) and the pseudo-label targets (round 2); batch 19 gives clients of 134/133/133 samples 8/7/7 steps:
# client 0's last batch holds one sample while clients 1 and 2 ride along
@pytest.mark.parametrize("params,settings", [
    ({"t_pl": 2, "forget_ramp_rounds": 2}, {"batch_size": 19}),
    # short last batches; the paper's gradient through L_cen (a sum over the features) with λ_cen = 1 makes
    # this small MLP's weights grow twentyfold in two rounds, which amplifies the engines' float rounding
    # (counters still equal), so a small λ_cen keeps the comparison at rounding level
    ({"t_pl": 1, "forget_ramp_rounds": 2, "cen_grad": True, "fg_init": "round0_mean", "lambda_cen": 0.05}, {}),
])
def test_rofl_batched_equals_sequential(params, settings):
    _assert_same_rofl_run(params, **settings)
