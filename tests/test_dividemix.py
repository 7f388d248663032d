"""DivideMix in FL (baselines.md §10): the spec's Test cases on the pure parts, plus a short run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.methods.dividemix import (
    DivideMixParams,
    EnsembleModel,
    clean_posterior,
    co_guess,
    co_refine,
    mixmatch_loss,
    normalise_losses,
    prior_penalty,
    sharpen,
    unlabelled_weight,
)
from fnlcore.randaugment import mix_targets, mixup


def test_sharpen_by_hand():
    out = sharpen(torch.tensor([[0.6, 0.4]]), 0.5)  # 0.36 / 0.52, 0.16 / 0.52
    assert torch.allclose(out, torch.tensor([[0.6923, 0.3077]]), atol=1e-4)
    assert torch.allclose(sharpen(torch.tensor([[0.6, 0.4]]), 1.0), torch.tensor([[0.6, 0.4]]))


def test_co_refinement_keeps_the_label_at_w1_and_mixes_otherwise():
    y = F.one_hot(torch.tensor([2, 0]), 3).float()
    p1 = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    p2 = torch.tensor([[0.4, 0.3, 0.3], [0.3, 0.3, 0.4]])
    assert torch.allclose(co_refine(y, torch.ones(2), [p1, p2], 0.5), y)
    # w = 0.5, row 0: 0.5*[0,0,1] + 0.5*[0.3,0.4,0.3] = [0.15, 0.2, 0.65]; squared / sum
    raw = torch.tensor([0.15, 0.2, 0.65]) ** 2
    got = co_refine(y, torch.tensor([0.5, 0.5]), [p1, p2], 0.5)
    assert torch.allclose(got[0], raw / raw.sum())


def test_co_guessing_averages_both_networks_and_views_then_sharpens():
    ps = [torch.tensor([[0.5, 0.5]]), torch.tensor([[0.7, 0.3]]), torch.tensor([[0.9, 0.1]]), torch.tensor([[0.5, 0.5]])]
    # mean [0.65, 0.35] -> squared [0.4225, 0.1225] / 0.545
    assert torch.allclose(co_guess(ps, 0.5), torch.tensor([[0.4225, 0.1225]]) / 0.545)


def test_unlabelled_weight_ramps_from_w_over_16_rounds():
    assert unlabelled_weight(50, 25.0, 50, 16) == 0.0
    assert unlabelled_weight(30, 25.0, 50, 16) == 0.0
    assert unlabelled_weight(58, 25.0, 50, 16) == pytest.approx(12.5)
    assert unlabelled_weight(50.5, 25.0, 50, 16) == pytest.approx(25 * 0.5 / 16)
    assert unlabelled_weight(66, 25.0, 50, 16) == 25.0 and unlabelled_weight(300, 25.0, 50, 16) == 25.0


def test_prior_penalty_is_zero_for_a_uniform_mean_prediction_and_positive_otherwise():
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0]])  # mean softmax exactly uniform
    assert prior_penalty(logits).abs() < 1e-6
    skewed = torch.tensor([[5.0, 0.0], [5.0, 0.0]])
    p = torch.softmax(skewed, 1)[0]
    expect = 0.5 * (np.log(0.5 / p[0].item()) + np.log(0.5 / p[1].item()))
    assert prior_penalty(skewed).item() == pytest.approx(expect, rel=1e-5) and expect > 0


def test_mixmatch_loss_by_hand():
    lx = torch.tensor([[0.0, 0.0]])  # softmax 0.5/0.5: soft CE = log 2
    lu = torch.tensor([[0.0, 0.0]])
    tx, tu = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]])  # L_u = mean(0.25, 0.25) = 0.25
    assert mixmatch_loss(lx, tx, lu, tu, 4.0).item() == pytest.approx(np.log(2) + 4 * 0.25, rel=1e-6)


def test_gmm_division_labels_the_small_loss_half():
    losses = np.r_[np.full(50, 0.01), np.full(50, 2.0)]
    for seed in (0, 1, 7):
        w = clean_posterior(losses, 10, 1e-2, 5e-4, seed)
        assert (w > 0.5).tolist() == [True] * 50 + [False] * 50
    assert normalise_losses(losses).tolist() == [0.0] * 50 + [1.0] * 50


def test_gmm_guard_on_degenerate_losses():
    assert clean_posterior(np.full(10, 0.3), 10, 1e-2, 5e-4, 0).tolist() == [1.0] * 10
    assert clean_posterior(np.array([0.3]), 10, 1e-2, 5e-4, 0).tolist() == [1.0]
    assert normalise_losses(np.full(3, 1.0)) is None


def test_mixup_keeps_the_major_share():
    x = torch.randn(8, 3)
    y = torch.eye(8)
    for s in range(30):
        _, ya, yb, lam = mixup(x, y, 4.0, torch.Generator().manual_seed(s), keep_major=True)
        assert lam >= 0.5
        top = mix_targets(ya, yb, lam).max(1).values  # lam, or 1 where a row is its own partner
        assert torch.all(((top - lam).abs() < 1e-6) | ((top - 1).abs() < 1e-6))


def test_ensemble_model_returns_log_mean_softmax():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    out = EnsembleModel(a, b)(x)
    mean = (torch.softmax(a(x), 1) + torch.softmax(b(x), 1)) / 2
    assert torch.allclose(out.exp(), mean, atol=1e-6)


def test_params_reject_a_warmup_covering_the_whole_run():
    with pytest.raises(ConfigError, match="warmup_rounds"):
        DivideMixParams(warmup_rounds=10).check_training(TrainSettings(rounds=10))
    DivideMixParams(warmup_rounds=9).check_training(TrainSettings(rounds=10))
    with pytest.raises(ConfigError):
        DivideMixParams(evaluate="net2")


# -- end to end ----------------------------------------------------------------------------


def _method(rounds=3, epochs=1, **kw):
    from fnlcore.methods.dividemix import DivideMix

    from .engine_helpers import make_ctx

    ctx = make_ctx(TrainSettings(rounds=rounds, local_epochs=epochs, batch_size=16, optimizer="adam", lr=3e-3,
                                 client_fraction=0.5))
    return DivideMix(DivideMixParams(warmup_rounds=1, rampup_rounds=2, **kw), ctx), ctx


def test_a_short_run_warms_up_then_co_divides_and_mixes(tmp_path, monkeypatch):
    from fnlcore.fl.simulation import Simulation
    from fnlcore.methods.dividemix import DivideMix

    m, ctx = _method()
    calls = []
    step = DivideMix.mixmatch_step

    def counted(self, net, peer, labelled, unlabelled, weight_u):
        calls.append((len(labelled[1]), len(unlabelled[1]), weight_u, peer.training))
        return step(self, net, peer, labelled, unlabelled, weight_u)

    monkeypatch.setattr(DivideMix, "mixmatch_step", counted)
    df = Simulation(m, ctx, tmp_path / "ck.pt", progress=lambda s: None).run()
    assert df["stage"].tolist() == ["warmup", "dividemix", "dividemix"]
    assert np.isnan(df["labelled_frac"].iloc[0]) and df["labelled_frac"].iloc[1:].between(0, 1).all()
    assert {"acc", "acc_net1", "acc_net2"} <= set(df.columns) and df["acc"].notna().all()
    assert calls and not any(c[3] for c in calls)  # the peer stays frozen (eval mode)
    ws = [c[2] for c in calls]
    # W = 1, ramp 2 rounds: λ_u = 0 at the first step of round 1, 12.5 <= λ_u < 25 in round 2
    assert ws[0] == 0.0 and 12.5 <= max(ws) < 25.0
    a, b = (m.globals[n].state_dict()["head.weight"] for n in ("net1", "net2"))
    assert not torch.equal(a, b)


def test_an_empty_unlabelled_set_falls_back_to_ce_on_all_data(monkeypatch):
    from fnlcore.fl.sequential import train_client
    from fnlcore.methods.dividemix import DivideMix

    m, ctx = _method()
    monkeypatch.setattr(DivideMix, "mixmatch_step", lambda *a: pytest.fail("MixMatch ran on an empty set"))
    # every sample clean (w = 1): U is empty for both networks in every epoch
    monkeypatch.setattr(DivideMix, "divide", lambda self, net, idx: torch.ones(len(idx), device=ctx.device))
    before = {n: m.globals[n].state_dict()["head.weight"].clone() for n in m.networks}
    m.begin_round(1)
    assert m.stage_name(1) == "dividemix"
    upd = train_client(m, 1, 1)
    assert upd.uploads["train_loss"] > 0
    for n in m.networks:
        assert not torch.equal(before[n], upd.states[n]["head.weight"]), n


def test_evaluated_model_is_the_ensemble_or_net1():
    from fnlcore.fl.local import predict

    m, ctx = _method()
    x_idx = torch.arange(5)
    out = predict(ctx, m.eval_model(), ctx.data.test, x_idx)
    p1 = torch.softmax(predict(ctx, m.globals["net1"], ctx.data.test, x_idx), 1)
    p2 = torch.softmax(predict(ctx, m.globals["net2"], ctx.data.test, x_idx), 1)
    assert torch.allclose(out.exp(), (p1 + p2) / 2, atol=1e-6)
    m1, _ = _method(evaluate="net1")
    assert m1.eval_model() is m1.globals["net1"]
