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
from .support.steps import one_step


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

    loss = m.loss(one_step(ctx, Fixed(), torch.zeros(3, 1, 8, 8), idx, k, nets={}))  # the one loss form at K = 1
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


# -- FedMLP losses (fedmlp.md §2.1-2.3, 2.6) ----------------------------------------------------

from fnlcore.fl.settings import TrainSettings  # noqa: E402
from fnlcore.fl.simulation import Simulation  # noqa: E402
from fnlcore.methods.fedmlp import (  # noqa: E402
    UNLABELLED, aggregate_degrees, aggregate_prototypes, class_prototypes, confidence, la_bce, la_shift,
    learning_degree, select_pseudo_labels, stage2_loss,
)
from fnlcore.methods.partial_label_losses import missing_distillation, wpc_loss  # noqa: E402


def test_la_shift_is_tau_log_odds_of_the_prior():
    shift = la_shift(torch.tensor([0.25, 0.5, 0.0, 1.0]), 1.0)
    assert shift[0].item() == pytest.approx(-1.098612, abs=1e-6) and shift[1].item() == 0.0
    assert shift[2].item() == -math.inf and shift[3].item() == math.inf
    assert la_shift(torch.tensor([0.0, 1.0, 0.3]), 0.0).tolist() == [0.0, 0.0, 0.0]  # tau 0: no adjustment, no NaN


def test_la_bce_by_hand_and_equal_to_the_codes_probability_form():
    # z = 0 (p = 0.5), pi = 0.25: p~ = 0.5*0.25 / (0.5*0.25 + 0.5*0.75) = 0.25
    shift = la_shift(torch.tensor([0.25, 0.25]), 1.0)
    out = la_bce(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), shift)
    assert out[0].tolist() == pytest.approx([1.386294, 0.287682], abs=1e-6)  # -ln 0.25, -ln 0.75
    # z = ln 3 (p = 0.75), pi = 0.25: p~ = 0.1875 / (0.1875 + 0.1875) = 0.5 -> ln 2
    assert la_bce(torch.tensor([[math.log(3)]]), torch.tensor([[1.0]]), la_shift(torch.tensor([0.25]), 1.0)).item() == (
        pytest.approx(math.log(2), abs=1e-6)
    )
    # prior 0 or 1 (a class without / with only positives): finite, and no NaN gradient
    z = torch.tensor([[30.0, -30.0]], requires_grad=True)
    loss = la_bce(z, torch.tensor([[0.0, 1.0]]), la_shift(torch.tensor([0.0, 1.0]), 1.0)).sum()
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(z.grad).all()


def test_wpc_loss_by_hand_counts_only_annotated_classes():
    # one client (K = 1): (1, B, C) logits and labels, (1, C) shift and class mask, no padding
    pi = torch.tensor([0.25, 0.5, 0.5])
    y = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]])
    z = torch.zeros(1, 2, 3, requires_grad=True)
    loss = wpc_loss(z, y, la_shift(pi, 1.0)[None], torch.tensor([[1.0, 1.0, 0.0]]), 4, None)
    assert loss.shape == (1,)
    # entries: -ln .25, -ln .5, -ln .75, -ln .5 = 3.060270; / (B=4 * |A|=2)
    assert loss.item() == pytest.approx(3.060270 / 8, abs=1e-6)
    loss.backward()
    assert z.grad[0, :, 2].abs().sum() == 0  # the missing class gets no gradient


def test_missing_distillation_by_hand():
    # one client (K = 1): (1, B, C) probabilities, (1, C) missing classes, no padding
    p = torch.tensor([[[0.9, 0.2], [0.5, 0.5]]])
    q = torch.tensor([[[0.6, 0.2], [0.5, 0.1]]])
    assert missing_distillation(p, q, torch.tensor([[0.0, 1.0]]), 2, None).item() == pytest.approx(0.16 / 2)
    assert missing_distillation(p, q, torch.tensor([[0.0, 0.0]]), 2, None).item() == 0.0


def test_stage2_loss_by_hand_with_and_without_consistency():
    # one client (K = 1): (1, B, C) entries, no padding
    per = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    mse = torch.tensor([[[10.0, 20.0], [30.0, 40.0]]])
    s = torch.tensor([[[1, 0], [1, 1]]], dtype=torch.bool)
    assert stage2_loss(per, mse, s, None).item() == pytest.approx((1 + 3 + 4 + 20) / 4)
    assert stage2_loss(per, None, s, None).item() == pytest.approx(8 / 3)


# -- prototypes, learning degree, server averages, threshold rule (§2.4-2.5) ----------------------------


def test_class_prototypes_by_hand():
    f = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    p = class_prototypes(f, y, torch.tensor([1.0, 1.0]))
    assert p[0, 1].tolist() == [2.0, 0.0] and p[0, 0].tolist() == [0.0, 2.0]
    assert p[1, 1].tolist() == [1.5, 1.0] and p[1, 0].tolist() == [1.0, 0.0]
    p = class_prototypes(f, y, torch.tensor([1.0, 0.0]))  # class 1 missing: zero prototypes
    assert p[1].abs().sum() == 0 and p[0, 1].tolist() == [2.0, 0.0]
    p = class_prototypes(f[:2], y[:2], torch.tensor([1.0, 1.0]))  # class 0 has no negatives: zero vector
    assert p[0, 0].tolist() == [0.0, 0.0]


def test_learning_degree_counts_strictly_outside_low_high():
    p = torch.tensor([[0.1], [0.5], [0.8], [0.3]])
    assert learning_degree(p, 0.3, 0.7).tolist() == [0.5]


def test_server_prototypes_average_over_labelling_clients_nan_when_none():
    c0 = torch.tensor([[[0.0], [4.0]], [[2.0], [2.0]], [[0.0], [0.0]]])
    c1 = torch.tensor([[[4.0], [8.0]], [[100.0], [100.0]], [[0.0], [0.0]]])
    actives = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])]
    g = aggregate_prototypes([c0, c1], [1, 3], actives)
    assert g[0].flatten().tolist() == [3.0, 7.0]  # (1*0 + 3*4) / 4, (1*4 + 3*8) / 4
    assert g[1].flatten().tolist() == [2.0, 2.0]  # only client 0 labels class 1
    assert torch.isnan(g[2]).all()  # nobody labels class 2


def test_server_degrees_average_over_missing_clients_one_when_none():
    d = aggregate_degrees([torch.tensor([0.9, 0.9, 0.2]), torch.tensor([0.9, 0.6, 0.6])], [1, 3],
                          [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])])
    assert d.tolist() == pytest.approx([1.0, 0.6, 0.5])  # nobody misses 0; client 1 misses 1; (0.2 + 3*0.6) / 4


def test_confidence_sign_is_the_codes():
    s = confidence(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert s.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_self_adaptive_threshold_rule_by_hand():
    s = torch.tensor([0.5, 0.1, 0.5, -0.2, -0.6, 0.0, -0.6, 0.3])  # |S0| = 5 (0 counts), |S1| = 3
    neg, pos = select_pseudo_labels(s, degree=0.8, lambda0=0.5, lambda1=0.9)
    # n0 = floor(0.5 * 0.8 * 5) = 2 largest s; n1 = floor(0.9 * 0.8 * 3) = floor(2.16) = 2 smallest
    assert neg.tolist() == [0, 2] and pos.tolist() == [4, 6]
    neg, pos = select_pseudo_labels(s, degree=1.0, lambda0=0.5, lambda1=0.5)  # floor(2.5), floor(1.5)
    assert neg.tolist() == [0, 2] and pos.tolist() == [4]
    neg, pos = select_pseudo_labels(s, degree=1.0, lambda0=0.005, lambda1=0.01)  # the defaults on 8 samples: none
    assert len(neg) == 0 and len(pos) == 0
    neg, _ = select_pseudo_labels(torch.tensor([0.2, 0.2, 0.2]), 1.0, 0.5, 0.5)  # ties: residual order
    assert neg.tolist() == [0]


def _fedmlp(ctx, **kw):
    return METHODS["fedmlp"](method_from_dict({"name": "fedmlp", "warmup_rounds": 1, **kw}), ctx)


def test_detection_uses_the_learning_degree_only_with_st_and_never_touches_annotated_classes():
    s = TrainSettings(rounds=3, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    for st, expect_any in ((True, False), (False, True)):
        ctx = make_ctx(s, multi_label=True, missing=2)
        m = _fedmlp(ctx, st=st, lambda0=0.5, lambda1=0.5)
        gen = torch.Generator().manual_seed(0)
        m.protos_g = torch.randn(4, 2, m.global_model.feature_dim, generator=gen)
        m.degree_g = torch.zeros(4)  # nothing learned: ST labels nothing
        idx = ctx.data.clients[0]
        m._detect(0, idx)
        ps = m.pseudo[idx]
        assert (ps[:, m.active[0].bool()] == UNLABELLED).all()
        assert bool((ps != UNLABELLED).any()) == expect_any
        if not st:
            before = ps.clone()
            m._detect(0, idx)  # the next round labels only residual samples; earlier labels stay
            after = m.pseudo[idx]
            kept = before != UNLABELLED
            assert torch.equal(after[kept], before[kept]) and (after != UNLABELLED).sum() > kept.sum()
            # per missing class: floor(0.5 |S0|) + floor(0.5 |S1|) of 100 samples, i.e. 49 or 50
            assert all(int((before[:, c] != UNLABELLED).sum()) in (49, 50) for c in (2, 3))


def test_pos_needs_neg_drops_a_class_pseudo_positives_when_it_gets_no_pseudo_negatives():
    """The released code (utils/local_training.py L1076/L1099 at 2ad28b8) keeps no pseudo-positives of a class
    in a round whose n_0 is 0; pos_needs_neg: false selects S_0 and S_1 independently (fedmlp.md §2.5)."""
    s = TrainSettings(rounds=3, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    got = {}
    for gate in (True, False):
        ctx = make_ctx(s, multi_label=True, missing=2)
        # lambda0 = 0: n_0 = 0 for every class; lambda1 = 0.5: n_1 = floor(|S_1| / 2) > 0
        m = _fedmlp(ctx, st=False, lambda0=0.0, lambda1=0.5, pos_needs_neg=gate)
        gen = torch.Generator().manual_seed(0)
        m.protos_g = torch.randn(4, 2, m.global_model.feature_dim, generator=gen)
        m.degree_g = torch.ones(4)
        m.begin_round(1)
        idx = ctx.data.clients[0]
        m._detect(0, idx)
        ps = m.pseudo[idx]
        assert not (ps == 0).any()
        got[gate] = (int((ps == 1).sum()), m._dropped)
    assert got[False][0] > 0 and got[False][1] == 0  # the paper: pseudo-positives without pseudo-negatives
    assert got[True] == (0, got[False][0])  # the code: all of them dropped, and counted
    assert METHODS["fedmlp"].Params().pos_needs_neg  # the code's behaviour is the default
    assert "pos_needs_neg" in METHODS["fedmlp"].Params.switches


# -- end to end -------------------------------------------------------------------------------------

E2E = TrainSettings(rounds=5, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3, checkpoint_every=1)


def _e2e(tmp_path=None, stop_after=None, **kw):
    ctx = make_ctx(E2E, multi_label=True, missing=2)
    m = METHODS["fedmlp"](method_from_dict({"name": "fedmlp", "warmup_rounds": 2, "lambda0": 0.3, "lambda1": 0.3, **kw}), ctx)
    ckpt = None if tmp_path is None else tmp_path / "ck.pt"
    return Simulation(m, ctx, checkpoint_path=ckpt, progress=lambda s: None, stop_after=stop_after), m


def test_fedmlp_runs_through_warmup_into_stage2_and_resumes_exactly(tmp_path):
    sim, m = _e2e()
    df = sim.run()
    assert df["stage"].tolist() == ["warmup"] * 2 + ["stage2"] * 3
    assert df["bacc"].notna().all() and df["bacc"].iloc[-1] > 0.7
    assert m.protos_g is not None and torch.isfinite(m.protos_g).all()
    assert df["mld_pseudo_pos"].iloc[-1] > 0 and df["mld_pseudo_neg"].iloc[-1] > 0
    assert df["mld_agreement"].iloc[-1] > 0.8  # the binary digit labels are easy: pseudo-labels mostly right
    ps = m.pseudo
    assert (ps[m.active.bool().repeat_interleave(100, 0)] == UNLABELLED).all()  # annotated entries never pseudo-labelled
    res = m.client_results()
    assert res["pseudo_pos"].sum() == df["mld_pseudo_pos"].iloc[-1]
    # per-round outputs: d^G_c from the last warm-up round on, new pseudo-labels per round summing to the totals
    deg = df[[f"mld_degree_{c}" for c in range(4)]]
    assert deg.iloc[0].isna().all() and deg.iloc[1:].notna().all().all()
    assert torch.allclose(torch.tensor(deg.iloc[-1].tolist()), m.degree_g.float().cpu())
    st2 = df[df["stage"] == "stage2"]
    assert st2["mld_new_pos"].sum() == st2["mld_pseudo_pos"].iloc[-1] and st2["mld_new_neg"].sum() == st2["mld_pseudo_neg"].iloc[-1]
    assert (st2[["mld_new_pos", "mld_new_neg", "mld_dropped_pos"]] >= 0).all().all()

    killed, _ = _e2e(tmp_path, stop_after=3)
    killed.run()
    resumed, m2 = _e2e(tmp_path)
    out = resumed.run()
    cols = [c for c in df.columns if c != "seconds"]
    import pandas as pd

    pd.testing.assert_frame_equal(out[cols], df[cols], check_exact=True)
    assert torch.equal(m2.pseudo, m.pseudo) and torch.equal(m2.protos_g, m.protos_g)


@pytest.mark.parametrize("kw", [
    {"wpc": False, "cr": "none", "st": False},  # Table 3: +MLD
    {"cr": "none", "st": False},  # +MLD+WPC
    {"st": False},  # +MLD+WPC+CR
    {"tau": 0.0, "st": False, "cr": "warmup"},  # the released code
    {"mld": False},
    {"wpc": False},
])
def test_ablation_switches_train_without_nan(kw):
    ctx = make_ctx(TrainSettings(rounds=3, local_epochs=1, batch_size=32, optimizer="adam", lr=3e-3), multi_label=True)
    m = _fedmlp(ctx, lambda0=0.3, lambda1=0.3, **kw)
    df = Simulation(m, ctx, progress=lambda s: None).run()
    assert df["bacc"].notna().all() and (df["stage"] == "stage2").sum() == 2
    assert (m.pseudo != UNLABELLED).any() == kw.get("mld", True)


def test_fedmlp_rejects_single_label_data_and_a_warmup_longer_than_the_run():
    with pytest.raises(ConfigError, match="'fedmlp'.*multi-label data only"):
        _fedmlp(make_ctx())
    with pytest.raises(ConfigError, match="warmup_rounds=5 must be < training.rounds=4"):
        METHODS["fedmlp"](method_from_dict({"name": "fedmlp", "warmup_rounds": 5}), make_ctx(multi_label=True))
    with pytest.raises(ConfigError, match="low"):
        method_from_dict({"name": "fedmlp", "low": 0.8})


def test_plus_mld_ablation_is_fedavgs_loss_with_pseudo_labels_injected():
    ctx = make_ctx(multi_label=True, missing=2)
    m = _fedmlp(ctx, wpc=False, cr="none", st=False)
    idx = ctx.data.clients[0][:3]
    m.pseudo[idx[0], 2] = 1  # a pseudo-positive of missing class 2; class 3 stays unlabelled (target 0)

    class Zero(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(len(x), 4)

    loss = m.loss_stage2(_batch(m, "stage2", Zero(), idx))
    y = ctx.data.y_true[idx] * ctx.data.active[idx]
    y[0, 2] = 1.0
    pw = m.pos_weights()[0]
    expected = ((y * pw + (1 - y)) * math.log(2)).sum() / (ctx.settings.batch_size * 4)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_plan_rejects_a_method_on_the_wrong_label_kind():
    from types import SimpleNamespace

    from fnlcore.app.plan import _check_method_fits

    multi, single = SimpleNamespace(multi_label=True), SimpleNamespace(multi_label=False)
    with pytest.raises(ConfigError, match=r"^table t, row 'x': method 'fedmlp'.*single-label"):
        _check_method_fits("table t, row 'x'", method_from_dict({"name": "fedmlp"}), single)
    with pytest.raises(ConfigError, match="method 'rofl'"):
        _check_method_fits("w", method_from_dict({"name": "rofl"}), multi)
    _check_method_fits("w", method_from_dict({"name": "fedmlp"}), multi)
    _check_method_fits("w", method_from_dict({"name": "fedavg"}), multi)
    _check_method_fits("w", method_from_dict({"name": "fedavg"}), single)


def _batch(m, stage: str, model: torch.nn.Module, idx: torch.Tensor, k: int = 0):
    """A step of client k on samples ``idx`` in ``stage`` as the sequential engine hands it to the stage's
    one loss form (K = 1: its job from the stage's prepare, then the stage's begin hook; round 1)."""
    ctx = m.ctx
    st = m.stages[stage]
    job = st.prepare(m, 1, k, m.workers)
    st.begin(m, 1, [k], [job])
    x = ctx.data.train.images[idx]
    v = ctx.pipeline.train(x, ctx.aug_gen)
    raw = stage == "warmup"  # the warm-up's two declared views; stage 2 trains on the train view
    return one_step(ctx, model, v if not raw else x, idx, k, nets=m.workers, job=job, r=1, raw=raw,
                    views={"weak:1": v, "weak:2": v})


class _Zero(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(len(x), 4)


def _hand_la(y: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """l_LA at z = 0: p~ = pi, so -log pi for a positive and -log(1 - pi) for a negative."""
    return -(y * torch.log(pi) + (1 - y) * torch.log1p(-pi))


def test_warmup_loss_composes_wpc_and_distillation_by_hand():
    ctx = make_ctx(multi_label=True, missing=2)  # no augmentation on digits: both views are equal
    m = _fedmlp(ctx)
    m.global_logits = lambda sb, view=None: torch.full((*sb.idx.shape, 4), math.log(1 / 3))  # sigmoid: 0.25
    client = ctx.data.clients[0]
    idx = client[:2]
    loss = m.loss_warmup(_batch(m, "warmup", _Zero(), idx))
    pi = ctx.data.y_true[client].mean(0)  # n_c^+ / N_k
    y = ctx.data.y_true[idx]
    wpc = _hand_la(y[:, :2], pi[:2]).sum() / (16 * 2)  # client 0 annotates classes 0, 1; B = 16 nominal
    dist = 2 * 2 * (0.5 - 0.25) ** 2 / (16 * 2)  # 2 samples x 2 missing classes
    assert loss.item() == pytest.approx((wpc + dist).item(), rel=1e-6)  # 1/2 (W + W) + 1/2 (D + D)


def test_stage2_loss_full_method_by_hand():
    ctx = make_ctx(multi_label=True, missing=2)
    m = _fedmlp(ctx)
    m.global_logits = lambda sb, view=None: torch.full((*sb.idx.shape, 4), math.log(1 / 3))  # sigmoid: 0.25
    client = ctx.data.clients[0]
    idx = client[:2]
    m.pseudo[idx[0], 2] = 1  # one pseudo-positive of missing class 2 on the client: pi_2 = 1/100
    loss = m.loss_stage2(_batch(m, "stage2", _Zero(), idx))
    pi = ctx.data.y_true[client].mean(0)
    y = ctx.data.y_true[idx]
    sup = _hand_la(y[:, :2], pi[:2]).sum() + (-math.log(0.01))  # annotated entries + the pseudo-positive
    unc = 3 * (0.5 - 0.25) ** 2  # (0, 3), (1, 2), (1, 3)
    assert loss.item() == pytest.approx((sup + unc).item() / 8, rel=1e-6)  # / (sum s + sum u) = 2 x 4
    no_cr = _fedmlp(ctx, cr="warmup")
    no_cr.pseudo = m.pseudo
    loss = no_cr.loss_stage2(_batch(no_cr, "stage2", _Zero(), idx))
    assert loss.item() == pytest.approx(sup.item() / 5, rel=1e-6)  # HEAD code: / sum s
