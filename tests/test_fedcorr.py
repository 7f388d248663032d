"""FedCorr: hand-computed cases for each pure part, and short runs on digits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fnlcore.errors import ConfigError, FNLError
from fnlcore.fl.contract import ClientUpdate
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS
from fnlcore.methods.fedcorr import (
    FedCorr, FedCorrParams, client_split, confident_relabels, estimate_noise_level, lid_scores,
    relabel_candidates, stage_schedule,
)
from fnlcore.methods.parts import MixupDraw, mixup_cross_entropy, mixup_view, proximal_term

from .engine_helpers import make_ctx
from .support.steps import one_step


# -- LID -----------------------------------------------------------------------------------------


def test_lid_on_three_points_by_hand():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    eps = 1e-6
    # point 0: neighbours at 1 and 3; point 1: 1 and 2; point 2: 2 and 3 (self dropped)
    want = [-2 / (math.log(1 / (3 + eps)) + math.log(3 / (3 + eps)) + eps),
            -2 / (math.log(1 / (2 + eps)) + math.log(2 / (2 + eps)) + eps),
            -2 / (math.log(2 / (3 + eps)) + math.log(3 / (3 + eps)) + eps)]
    assert lid_scores(x, k=2).tolist() == pytest.approx(want, rel=1e-12)
    assert want[0] == pytest.approx(1.8204784, rel=1e-6)


def test_lid_keeps_k_in_the_numerator_when_a_client_has_fewer_neighbours():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    # k=20 but only 2 neighbours: the code's slice keeps 2 distances, the numerator stays -20
    np.testing.assert_allclose(lid_scores(x, k=20).numpy(), 10 * lid_scores(x, k=2).numpy(), rtol=1e-12)


def test_lid_drops_self_and_a_duplicate_gives_zero():
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [2.0, 0.0]])
    lid = lid_scores(x, k=2)
    # rows 0 and 1: nearest other distance 0 -> log 0 = -inf -> LID 0
    assert lid[0].item() == 0.0 and lid[1].item() == 0.0
    assert lid[2].item() == pytest.approx(-2 / (2 * math.log(2 / (2 + 1e-6)) + 1e-6))


def test_lid_matches_the_scipy_form_of_the_code():
    from scipy.spatial.distance import cdist

    rs = np.random.RandomState(0)
    p = rs.dirichlet(np.ones(10), size=60).astype(np.float32)
    d = cdist(p, p)
    r = np.take_along_axis(d, np.argsort(d, axis=1)[:, 1:21], axis=1)
    want = -20 / (np.log(r / (r[:, -1:] + 1e-6)).sum(1) + 1e-6)
    np.testing.assert_allclose(lid_scores(torch.from_numpy(p), 20).numpy(), want, rtol=1e-9)


# -- GMM splits ----------------------------------------------------------------------------------


def test_client_split_marks_the_larger_mean_component_noisy():
    lid = np.array([1.0, 5.1, 1.1, 0.9, 5.0, 1.05])
    assert client_split(lid, seed=1).tolist() == [1, 4]
    assert client_split(-lid, seed=1).tolist() == [0, 2, 3, 5]  # the smaller mean is clean


def test_estimate_noise_level_is_the_large_loss_fraction():
    losses = np.array([1.50, 1.52, 1.49, 1.51, 1.48, 1.50, 2.40, 2.41, 2.39, 2.42], dtype=np.float32)
    assert estimate_noise_level(losses, seed=1) == pytest.approx(0.4)
    assert estimate_noise_level(losses[:1], seed=1) == 0.0


# -- relabel rules -------------------------------------------------------------------------------


def _probs(rows):
    return np.array(rows, dtype=np.float32)


def test_relabel_candidates_take_the_largest_losses_then_confident_ones():
    losses = np.array([0.1, 0.9, 0.5, 0.8, 0.2, 0.3, 0.7, 0.4, 0.6, 0.05])
    p = np.full((10, 3), 1 / 3, dtype=np.float32)
    p[0] = [0.9, 0.05, 0.05]  # confident but a small loss: not a candidate
    p[1] = [0.05, 0.05, 0.9]  # candidate, confident -> 2
    p[3] = [0.5, 0.25, 0.25]  # candidate, max exactly 0.5: not > 0.5
    p[6] = [0.6, 0.3, 0.1]  # candidate, confident -> 0
    # floor(10 * 0.6 * 0.5) = 3 candidates: losses 0.9, 0.8, 0.7 (samples 1, 3, 6)
    pos, lab = relabel_candidates(losses, p, 0.6, 0.5, 0.5)
    assert pos.tolist() == [1, 6] and lab.tolist() == [2, 0]
    # floor(10 * 0.55 * 0.5) = floor(2.75) = 2: samples 1 and 3 only
    pos, lab = relabel_candidates(losses, p, 0.55, 0.5, 0.5)
    assert pos.tolist() == [1] and lab.tolist() == [2]
    pos, _ = relabel_candidates(losses, p, 0.0, 0.5, 0.5)
    assert pos.tolist() == []


def test_confident_relabels_take_every_sample_above_the_threshold():
    p = _probs([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8], [0.49, 0.51]])
    pos, lab = confident_relabels(p, 0.5)
    assert pos.tolist() == [0, 2, 3] and lab.tolist() == [0, 1, 1]


# -- schedule ----------------------------------------------------------------------------------


def test_stage_schedule_maps_rounds_to_stage_iteration_and_group():
    got = [tuple(stage_schedule(r, 2, 3, 2)) for r in range(10)]
    assert got == [("preprocess", 0, 0), ("preprocess", 0, 1), ("preprocess", 0, 2),
                   ("preprocess", 1, 0), ("preprocess", 1, 1), ("preprocess", 1, 2),
                   ("finetune", None, None), ("finetune", None, None), ("usual", None, None), ("usual", None, None)]
    assert stage_schedule(6, 2, 3, 2, fine_tuning=False).stage == "usual"


def test_la_mixup_with_a_uniform_prior_equals_plain_mixup():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    lam, perm = MixupDraw(1.0)(6, torch.Generator().manual_seed(3), x.device)
    lam, perm = lam[None], perm[None]  # K = 1 client
    out = model(mixup_view(x, lam, perm))[None]

    def mix(shift):  # FedCorr+LA's shift: tau log(pi) inside both CE terms
        return mixup_cross_entropy(out, y[None], lam, perm, None, shift)

    plain = mix(None)
    la = mix(torch.log(torch.full((1, 1, 3), 1 / 3)))
    assert la.item() == pytest.approx(plain.item(), rel=1e-6)
    skewed = mix(torch.log(torch.tensor([[[0.8, 0.1, 0.1]]])))
    assert abs(skewed.item() - plain.item()) > 1e-3


def _ctx(rounds=2, **kw):
    s = TrainSettings(rounds=rounds, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    return make_ctx(s, seed=0, noisy_clients=(0, 1), rate=0.8, **kw)


def test_proximal_term_is_unsquared_scaled_by_mu_and_skips_batch_zero():
    ctx = _ctx()
    m = FedCorr(FedCorrParams(iterations1=1, rounds1=1, mixup=False, beta=5.0), ctx)
    m.noise_level[2] = 0.4
    m.begin_round(0)
    model = m.worker
    m.global_model.load_state_dict(m._ref)
    model.load_state_dict(m._ref)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    n_params = sum(p.numel() for p in model.parameters())
    x = ctx.pipeline.eval(ctx.data.train.images[:8])
    idx = torch.arange(8)

    def loss(step, k):  # the pre-processing stage's loss on one batch (K = 1, as the sequential engine runs it)
        return m.preprocess_loss(one_step(ctx, model, x, idx, k, nets=m.workers, step=step, networks=m.networks,
                                          ends_epoch=False))[0]

    base = loss(0, 2)
    with_prox = loss(1, 2)
    assert (with_prox - base).item() == pytest.approx(5.0 * 0.4 * 0.01 * math.sqrt(n_params), rel=1e-4)
    assert loss(1, 3).item() == pytest.approx(base.item())  # mu_k = 0: no term


def test_unsquared_proximal_term_has_a_nan_gradient_where_the_model_has_not_moved():
    model = torch.nn.Linear(3, 2)
    ref = {k: v.detach().clone() for k, v in model.named_parameters()}
    params = {n: p.unsqueeze(0) for n, p in model.named_parameters()}  # K = 1 client
    proximal_term(params, ref, list(ref), 2.0, "fedcorr_unsquared").sum().backward()
    assert all(torch.isnan(p.grad).all() for p in model.parameters())  # d sqrt(s)/ds at s = 0 times 0


def _upload(m, k, lid, losses):
    n = len(m.ctx.data.clients[k])
    return ClientUpdate(k, n, {"model": m.global_model.state_dict()}, {"lid": lid, "losses": np.full(n, losses)})


def test_a_non_finite_lid_stops_with_the_round_the_clients_and_the_cause():
    ctx = _ctx()
    m = FedCorr(FedCorrParams(iterations1=2, rounds1=1, frac1=0.5), ctx)  # groups of two clients
    for r in range(3):  # iteration 0 and the first group of iteration 1
        m.begin_round(r)
    m.noise_level[:] = [0.0, 0.3, 0.0, 0.0]
    with pytest.raises(FNLError) as e:  # client with mu_k > 0: the proximal term's NaN gradient
        m.aggregate(2, [_upload(m, 0, 1.0, 0.5), _upload(m, 1, float("nan"), float("nan"))])
    msg = str(e.value)
    assert not isinstance(e.value, ConfigError)
    assert "round 2 (pre-processing iteration 1, group 0)" in msg and "client(s) [1]" in msg
    assert "NaN gradient where w = w_g" in msg and "beta: 0" in msg and "lenet5_linear_head" in msg
    assert "beta*mu_k = 1.5" in msg and "diverged" not in msg
    with pytest.raises(FNLError, match=r"client\(s\) \[0, 3\].*Client\(s\) \[0, 3\] had no proximal term.*diverged"):
        m.aggregate(2, [_upload(m, 3, 1.0, float("inf")), _upload(m, 0, float("nan"), 0.5)])
    m.aggregate(2, [_upload(m, 0, 1.0, 0.5), _upload(m, 1, 2.0, 0.5)])  # finite: accepted
    assert m.lid_client[1] == 2.0


def test_a_model_that_never_moves_fails_clearly_not_inside_sklearn():
    # updates below float32 precision: in iteration 1 a noisy client's proximal term is taken at w = w_g
    s = TrainSettings(rounds=1, local_epochs=1, batch_size=16, optimizer="sgd", lr=1e-20)
    ctx = make_ctx(s, seed=0, noisy_clients=(0, 1), rate=0.8)
    m = FedCorr(FedCorrParams(iterations1=2, rounds1=0), ctx)
    with pytest.raises(FNLError, match="NaN gradient where w = w_g"):
        Simulation(m, ctx, progress=lambda s: None).run()


def test_check_training_rejects_fine_tuning_longer_than_training():
    with pytest.raises(ConfigError, match="rounds1"):
        FedCorrParams(rounds1=5).check_training(TrainSettings(rounds=4))


# -- end to end ------------------------------------------------------------------------------------


def test_run_goes_through_the_three_stages_and_records_relabels():
    ctx = _ctx(rounds=2)
    m = METHODS["fedcorr"](FedCorrParams(iterations1=1, rounds1=1), ctx)
    assert m.num_rounds() == 4 + 2
    df = Simulation(m, ctx, progress=lambda s: None).run()
    assert df["stage"].tolist() == ["preprocess"] * 4 + ["finetune", "usual"]
    assert df["clients"].tolist()[:4] == [1, 1, 1, 1]
    assert df["acc"].iloc[:4].isna().all() and df["acc"].iloc[4:].notna().all()
    rel = ctx.data.relabels.frame()
    assert len(rel) > 0 and set(rel["stage"]) <= {"preprocess", "finetune"}
    assert set(rel["client"]) <= set(m.noisy_set)
    res = m.client_results()
    assert res["detected_noisy"].tolist() == [k in m.noisy_set for k in range(4)]
    assert res["noise_rate"].iloc[2:].eq(0).all() and (res["noise_rate"].iloc[:2] > 0.5).all()
    assert {"client", "n", "lid_acc", "estimated_noise_level"} <= set(res.columns)


def test_fedcorr_la_runs_and_no_candidate_skips_fine_tuning():
    ctx = _ctx(rounds=2)
    m = FedCorr(FedCorrParams(iterations1=1, rounds1=1, logit_adjust=True), ctx)
    df = Simulation(m, ctx, progress=lambda s: None).run()
    assert df["acc"].iloc[4:].notna().all() and torch.isfinite(m.log_prior[m.log_prior > -math.inf]).all()
    # A8: every client above clean_set_thres -> stage 2 becomes usual training
    m.noise_level[:] = 0.5
    m._choose_finetune_clients()
    assert m.finetune_skipped and m.stage_name(4) == "usual" and len(m.select_clients(4)) == 4
