"""FedCorr (stages 2-3), FedDiv and JointOpt on the batched engine equal the sequential engine per client.

Each case checks that its batched stages were entered and ran on the batched engine. The default
clients (134, 133, 133 samples at batch 16) end every epoch with a padded short batch; batch 133
gives client 0 one more step per epoch than the others, so they ride along (masked) meanwhile.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fnlcore.fl import batched

from .test_batched import _assert_same_run, _run


def _batched_run(monkeypatch, method, params, **settings):
    """The batched run and the rounds whose clients trained on the batched engine."""
    rounds = []
    train_clients = batched.train_clients

    def counting(ctx, model, clients, loss_fn, round_index, *a, **kw):
        rounds.append(round_index)
        return train_clients(ctx, model, clients, loss_fn, round_index, *a, **kw)

    monkeypatch.setattr(batched, "train_clients", counting)
    return _run(method, "batched", params, **settings), rounds


def _evaluated(run):
    """The run with only its evaluated rounds' metrics (pre-processing and warm-up rounds have NaN scores)."""
    metrics, method, ctx = run
    return metrics[metrics["acc"].notna()], method, ctx


def _same(monkeypatch, method, params, batched_stages, **settings):
    seq = _run(method, "sequential", params, **settings)
    bat, rounds = _batched_run(monkeypatch, method, params, **settings)
    assert seq[0]["acc"].isna().tolist() == bat[0]["acc"].isna().tolist()
    _assert_same_run(_evaluated(seq), _evaluated(bat), 1e-6)
    m = bat[1]
    entered = {m.stage_key(r) for r in set(rounds)}
    assert entered == set(batched_stages), entered
    return seq, bat


# -- FedCorr: fine-tuning and usual rounds batched (pre-processing stays sequential) -------------------

FEDCORR = {"iterations1": 1, "rounds1": 1}  # 3 pre-processing rounds (one client each), then 1 + 1 rounds


@pytest.mark.parametrize("params,settings", [
    ({}, {}),
    ({"logit_adjust": True}, {"batch_size": 133, "local_epochs": 2}),  # riders
    ({"mixup": False}, {}),
    ({"mixup": False, "logit_adjust": True}, {"batch_size": 133}),
])
def test_fedcorr_training_stages_batched_equal_sequential(monkeypatch, params, settings):
    kw = {"rounds": 2, "local_epochs": 1, **settings}
    seq, bat = _same(monkeypatch, "fedcorr", {**FEDCORR, **params}, ("finetune", "usual"), **kw)
    assert seq[1].candidates == bat[1].candidates


# -- JointOpt: both stages batched; the joint stage's per-epoch label update at each client's epoch end --


@pytest.mark.parametrize("settings", [{}, {"batch_size": 133}])  # 133: client 0's epochs are one step longer
def test_jointopt_both_stages_batched_equal_sequential(monkeypatch, settings):
    kw = {"rounds": 3, "local_epochs": 2, **settings}
    seq, bat = _same(monkeypatch, "jointopt", {"warmup_rounds": 1, "history": 3}, ("warmup", "joint"), **kw)
    assert torch.allclose(seq[1].soft, bat[1].soft, atol=1e-5) and torch.equal(seq[1].counts, bat[1].counts)
    assert bool((bat[1].soft.max(1).values < 1).any())  # labels were updated from the histories


# -- FedDiv: the warm-up batched (its main rounds train in turn: see the stage table's note) ------------

FEDDIV = {"warmup_iterations": 2, "frac1": 1.0}  # each warm-up round trains a group of 3 draws (repeats allowed)


@pytest.mark.parametrize("params,settings", [
    ({}, {}),
    ({"reg_coef": 1.0, "bn_extra_forward": False}, {"batch_size": 133}),  # L_reg; riders
])
def test_feddiv_warmup_batched_equal_sequential(monkeypatch, params, settings):
    kw = {"rounds": 2, "local_epochs": 1, **settings}
    seq, bat = _same(monkeypatch, "feddiv", {**FEDDIV, **params}, ("warmup",), **kw)
    assert bat[0]["stage"].tolist() == ["warmup", "warmup", "main", "main"]
    assert (seq[1].counts == bat[1].counts).all()



# -- the declared mixup draws -----------------------------------------------------------------------------


def test_declared_mixup_draws_reproduce_mixup_and_its_generator_state():
    from fnlcore.methods.parts import MixupDraw, drawn_mixup_cross_entropy, mixup_cross_entropy

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    want, _ = mixup_cross_entropy(model, x, y, 0.7, g1)
    got, _ = drawn_mixup_cross_entropy(model, x, y, MixupDraw(0.7)(6, g2, x.device))
    assert torch.equal(want, got) and torch.equal(g1.get_state(), g2.get_state())
    assert MixupDraw(0.7) == MixupDraw(0.7) != MixupDraw(1.0)  # a chunk's clients agree on the declaration


def test_batched_mixup_keeps_each_client_in_its_own_batch_and_ignores_padded_partners():
    from fnlcore.methods.parts import batched_mixup_cross_entropy, batched_mixup_view

    x = torch.arange(2 * 3, dtype=torch.float32).view(6, 1)  # client 0: rows 0-2, client 1: rows 3-4 + a pad
    lam, perm = torch.tensor([0.25, 0.5]), torch.tensor([[2, 0, 1], [1, 0, 9]])  # 9: a padded row's partner
    mixed = batched_mixup_view(x, lam, perm).view(2, 3)
    assert mixed[0].tolist() == [0.25 * 0 + 0.75 * 2, 0.25 * 1 + 0.75 * 0, 0.25 * 2 + 0.75 * 1]
    assert mixed[1, :2].tolist() == [0.5 * 3 + 0.5 * 4, 0.5 * 4 + 0.5 * 3]
    logits, y = torch.randn(2, 3, 4), torch.tensor([[0, 1, 2], [3, 2, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    got = batched_mixup_cross_entropy(logits, y, lam, perm, mask)
    for i, n in ((0, 3), (1, 2)):
        z, p = logits[i, :n], perm[i, :n]
        want = lam[i] * F.cross_entropy(z, y[i, :n]) + (1 - lam[i]) * F.cross_entropy(z, y[i, :n][p])
        assert torch.allclose(got[i], want)
