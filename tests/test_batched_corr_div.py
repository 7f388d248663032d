"""FedCorr, FedDiv and JointOpt on the batched engine equal the sequential engine per client.

Each case checks that its batched stages were entered and ran on the batched engine, and compares
the method's per-client decisions (uploads, filters, splits). The default clients (134, 133, 133
samples at batch 16) end every epoch with a padded short batch; batch 133 gives client 0 one more
step per epoch than the others, so they ride along (masked) meanwhile.
"""

from __future__ import annotations

import numpy as np
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


def _recording_uploads(monkeypatch, cls):
    """Every run of ``cls`` from now on records each round's (client, uploads) in ``m.recorded``."""
    aggregate = cls.aggregate

    def recording(self, r, updates):
        updates = list(updates)
        self.__dict__.setdefault("recorded", []).append([(u.client, dict(u.uploads)) for u in updates])
        return aggregate(self, r, updates)

    monkeypatch.setattr(cls, "aggregate", recording)


def _same_uploads(a, b, exact=(), close=()):
    """The two runs' clients uploaded the same decisions (``exact``) and values (``close``), round by round."""
    assert len(a.recorded) == len(b.recorded)
    for ra, rb in zip(a.recorded, b.recorded):
        assert [k for k, _ in ra] == [k for k, _ in rb]
        for (_, ua), (_, ub) in zip(ra, rb):
            assert set(ua) == set(ub)
            for key in (k for k in exact if k in ua):  # a stage's uploads: those of this round's stage
                va, vb = ua[key], ub[key]
                assert torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb, key
            for key in (k for k in close if k in ua):
                va, vb = (torch.as_tensor(np.asarray(ua[key], dtype=np.float64)),
                          torch.as_tensor(np.asarray(ub[key], dtype=np.float64)))
                assert torch.allclose(va, vb, rtol=1e-4, atol=1e-5, equal_nan=True), key


# -- FedCorr: every stage batched (pre-processing with its reserved detection pass) -------------------

FEDCORR_PRE = {"iterations1": 2, "frac1": 1.0, "rounds1": 1}  # 2 iterations of one group of 3, then 1 + 1 rounds


@pytest.mark.parametrize("params,settings", [
    ({}, {}),  # iteration 1 trains the noisy clients with the proximal term (mu_k > 0)
    ({"mixup": False, "detection_augment": False}, {"batch_size": 133}),  # riders; an upload that draws nothing
])
def test_fedcorr_preprocessing_batched_equal_sequential(monkeypatch, params, settings):
    from fnlcore.methods.fedcorr import FedCorr

    _recording_uploads(monkeypatch, FedCorr)
    kw = {"rounds": 2, "local_epochs": 1, **settings}
    seq, bat = _same(monkeypatch, "fedcorr", {**FEDCORR_PRE, **params}, ("preprocess", "finetune", "usual"), **kw)
    a, b = seq[1], bat[1]
    _same_uploads(a, b, close=("lid", "losses", "train_loss"))
    assert a.noisy_set == b.noisy_set and a.candidates == b.candidates
    assert np.array_equal(a.noise_level, b.noise_level) and np.allclose(a.lid_acc, b.lid_acc, rtol=1e-5)
    assert any(a.params.beta * a.noise_level[k] > 0 for k in a.noisy_set)  # the proximal term was entered
    assert a.noisy_set and a.candidates  # detection split the clients


# -- FedCorr: the loss variants in every stage (pre-processing: one client per group) -------------------

FEDCORR = {"iterations1": 1, "rounds1": 1}  # 3 pre-processing rounds (one client each), then 1 + 1 rounds


@pytest.mark.parametrize("params,settings", [
    ({}, {}),
    ({"logit_adjust": True}, {"batch_size": 133, "local_epochs": 2}),  # riders
    ({"mixup": False}, {}),
    ({"mixup": False, "logit_adjust": True}, {"batch_size": 133}),
])
def test_fedcorr_training_stages_batched_equal_sequential(monkeypatch, params, settings):
    kw = {"rounds": 2, "local_epochs": 1, **settings}
    seq, bat = _same(monkeypatch, "fedcorr", {**FEDCORR, **params}, ("preprocess", "finetune", "usual"), **kw)
    assert seq[1].candidates == bat[1].candidates


# -- JointOpt: both stages batched; the joint stage's per-epoch label update at each client's epoch end --


@pytest.mark.parametrize("settings", [{}, {"batch_size": 133}])  # 133: client 0's epochs are one step longer
def test_jointopt_both_stages_batched_equal_sequential(monkeypatch, settings):
    kw = {"rounds": 3, "local_epochs": 2, **settings}
    seq, bat = _same(monkeypatch, "jointopt", {"warmup_rounds": 1, "history": 3}, ("warmup", "joint"), **kw)
    assert torch.allclose(seq[1].soft, bat[1].soft, atol=1e-5) and torch.equal(seq[1].counts, bat[1].counts)
    assert bool((bat[1].soft.max(1).values < 1).any())  # labels were updated from the histories


# -- FedDiv: the warm-up and the main rounds batched (PCS per local epoch trains in turn) -----------------

FEDDIV = {"warmup_iterations": 2, "frac1": 1.0}  # each warm-up round trains a group of 3 draws (repeats allowed)


@pytest.mark.parametrize("params,settings", [
    ({}, {}),
    ({"reg_coef": 1.0, "bn_extra_forward": False}, {"batch_size": 133}),  # L_reg; riders
])
def test_feddiv_warmup_batched_equal_sequential(monkeypatch, params, settings):
    kw = {"rounds": 2, "local_epochs": 1, **settings}
    seq, bat = _same(monkeypatch, "feddiv", {**FEDDIV, **params}, ("warmup", "main"), **kw)
    assert bat[0]["stage"].tolist() == ["warmup", "warmup", "main", "main"]
    assert (seq[1].counts == bat[1].counts).all()


FEDDIV_MAIN = {"warmup_iterations": 1, "frac1": 1.0, "participation_gate": 1, "zeta": 0.1}  # PCS from round 2
DIV_UPLOADS = {"exact": ("delta_hat", "train_size", "relabelled", "debiased"),
               "close": ("filter", "prior", "train_loss")}


def _same_feddiv_main(monkeypatch, params, stages, **settings):
    from fnlcore.methods.feddiv import FedDiv

    _recording_uploads(monkeypatch, FedDiv)
    seq, bat = _same(monkeypatch, "feddiv", {**FEDDIV_MAIN, **params}, stages, local_epochs=1, **settings)
    a, b = seq[1], bat[1]
    _same_uploads(a, b, **DIV_UPLOADS)
    assert np.array_equal(a.counts, b.counts) and np.array_equal(a.delta_hat, b.delta_hat)
    assert torch.equal(a.debiased, b.debiased) and torch.allclose(a.priors, b.priors, atol=1e-6)
    assert np.allclose(a.global_filter, b.global_filter) and np.allclose(a.local_filters, b.local_filters)
    return a, [u for rnd in a.recorded for _, u in rnd if "filter" in u]


@pytest.mark.parametrize("params,settings", [
    # main round 1: every client's gated set fits one batch (a chunk of riders only); then chunks of
    # clients with different step counts
    ({}, {"rounds": 3}),
    # per-client filters, round-only relabels; clean clients (delta_hat <= 0.5) train on all their data:
    # at batch 133 client 0 (134 samples) trains, clients 1 and 2 (133) do not and ride along
    ({"filter": "local", "persistent_relabels": False, "clean_set_thres": 0.5}, {"rounds": 2, "batch_size": 133}),
])
def test_feddiv_main_batched_equal_sequential(monkeypatch, params, settings):
    _, ups = _same_feddiv_main(monkeypatch, params, ("warmup", "main"), **settings)
    bs = settings.get("batch_size", 16)
    assert any(u["train_size"] <= bs for u in ups)  # a client that did not train (no phase)
    assert any(u["train_size"] > bs for u in ups)  # one that did
    assert any(u["relabelled"] > 0 for u in ups)  # relabels (R') entered
    thres = params.get("clean_set_thres", 0.1)
    assert any(u["delta_hat"] <= thres for u in ups) == ("clean_set_thres" in params)  # the clean-client rule


def test_feddiv_per_epoch_pcs_stays_sequential_and_equal(monkeypatch):
    """PCS before every local epoch (a detection pass between epochs) takes the stage table's sequential row."""
    m, ups = _same_feddiv_main(monkeypatch, {"pcs_reference": "local_epoch"}, ("warmup",), rounds=2)
    assert [m.stage_key(r) for r in range(m.num_rounds())] == ["warmup", "main_epoch_pcs", "main_epoch_pcs"]
    assert len(ups) == 6



# -- the declared mixup draws -----------------------------------------------------------------------------


def test_declared_mixup_draws_reproduce_mixup_and_its_generator_state():
    from fnlcore.methods.parts import MixupDraw, mixup_view
    from fnlcore.randaugment import mixup

    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    want_x, want_a, want_b, want_lam = mixup(x, y, 0.7, g1)
    lam, perm = MixupDraw(0.7)(6, g2, x.device)
    assert float(lam) == want_lam and torch.equal(y, want_a) and torch.equal(y[perm], want_b)
    assert torch.equal(mixup_view(x, lam[None], perm[None]), want_x)
    assert torch.equal(g1.get_state(), g2.get_state())
    assert MixupDraw(0.7) == MixupDraw(0.7) != MixupDraw(1.0)  # a chunk's clients agree on the declaration


def test_batched_mixup_keeps_each_client_in_its_own_batch_and_ignores_padded_partners():
    from fnlcore.methods.parts import mixup_cross_entropy, mixup_view

    x = torch.arange(2 * 3, dtype=torch.float32).view(6, 1)  # client 0: rows 0-2, client 1: rows 3-4 + a pad
    lam, perm = torch.tensor([0.25, 0.5]), torch.tensor([[2, 0, 1], [1, 0, 9]])  # 9: a padded row's partner
    mixed = mixup_view(x, lam, perm).view(2, 3)
    assert mixed[0].tolist() == [0.25 * 0 + 0.75 * 2, 0.25 * 1 + 0.75 * 0, 0.25 * 2 + 0.75 * 1]
    assert mixed[1, :2].tolist() == [0.5 * 3 + 0.5 * 4, 0.5 * 4 + 0.5 * 3]
    logits, y = torch.randn(2, 3, 4), torch.tensor([[0, 1, 2], [3, 2, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    got = mixup_cross_entropy(logits, y, lam, perm, mask)
    for i, n in ((0, 3), (1, 2)):
        z, p = logits[i, :n], perm[i, :n]
        want = lam[i] * F.cross_entropy(z, y[i, :n]) + (1 - lam[i]) * F.cross_entropy(z, y[i, :n][p])
        assert torch.allclose(got[i], want)
