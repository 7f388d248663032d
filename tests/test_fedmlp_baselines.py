"""FedAvg-PL and FedFixMatch as FedMLP adapts them (baselines.md §14, §16): hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from fnlcore.fl.contract import ClientUpdate
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.base import partial_bce
from fnlcore.methods.fedfixmatch import confident_pseudo_labels, unsupervised_loss

from .engine_helpers import make_ctx
from .support.steps import one_step


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
    model = _Logits(z)
    loss = m.loss(one_step(ctx, model, torch.zeros(2, 1, 8, 8), idx, k))  # the one loss form at K = 1
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
    # one client (K = 1): (1, B, C) probabilities, (1, C) missing classes
    missing = torch.tensor([[1.0, 0.0]])
    p = torch.tensor([[[0.9, 0.5], [0.5, 0.5], [0.1, 0.99]]])
    conf, hard = confident_pseudo_labels(p, missing, 0.8, 0.2)
    assert conf.tolist() == [[True, False, True]]  # the annotated class 1 does not matter
    assert hard[0, :, 0].tolist() == [1.0, 0.0, 0.0]
    conf, _ = confident_pseudo_labels(torch.tensor([[[0.9, 0.5]]]), torch.tensor([[1.0, 1.0]]), 0.8, 0.2)
    assert conf.tolist() == [[False]]  # must be confident on EVERY missing class


def _unsup_one(z, hard, confident, missing):
    """unsupervised_loss of one client (K = 1) from (B, C) logits and labels, (B,) and (C,) masks."""
    return unsupervised_loss(z[None], hard[None], confident[None], missing[None])[0].item()


def test_fixmatch_unsupervised_loss_by_hand():
    z = torch.tensor([[0.0, 2.0], [1.0, 1.0]])
    hard = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    missing = torch.tensor([0.0, 1.0])
    # only sample 0, only class 1: BCE(2, 0) = log(1 + e^2) / (|I| = 1 * |M| = 1)
    assert _unsup_one(z, hard, torch.tensor([True, False]), missing) == pytest.approx(2.126928, abs=1e-6)
    both = _unsup_one(z, hard, torch.tensor([True, True]), missing)
    assert both == pytest.approx((2.126928 + 1.313262) / 2, abs=1e-6)  # + log(1 + e^1)
    assert _unsup_one(z, hard, torch.tensor([False, False]), missing) == 0.0
    assert _unsup_one(z, hard, torch.tensor([True, True]), torch.zeros(2)) == 0.0


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


# -- RSCFed, FedIRM, CBAFed (baselines.md §15, §17, §18) ------------------------------------------

from fnlcore.errors import ConfigError  # noqa: E402
from fnlcore.fl.copies import OneCopy  # noqa: E402
from fnlcore.fl.state import snapshot  # noqa: E402
from fnlcore.methods import cbafed, fedirm, rscfed  # noqa: E402


def test_rscfed_subconsensus_weights_and_group_model_by_hand():
    # baselines.md §15: n = [1, 3], scalar models 0 and 4 -> mean 2, d = [2, 2]
    w = rscfed.subconsensus_weights([1, 3], [2.0, 2.0], 0.01)
    # 0.25 e^-0.02 = 0.2450493, 0.75 e^-0.0066667 = 0.7450166, normalised
    assert w.tolist() == pytest.approx([0.2475077, 0.7524923], abs=1e-6)
    states = [{"w": torch.tensor([0.0]), "n": torch.tensor(7)}, {"w": torch.tensor([4.0]), "n": torch.tensor(9)}]
    model, w2 = rscfed.group_consensus(states, [1, 3], 0.01)
    assert model["w"].item() == pytest.approx(3.0099692, abs=1e-5) and model["n"].item() == 7
    assert w2.tolist() == pytest.approx(w.tolist())
    # log space: a huge beta (the original's s = 1e4) does not underflow to 0/0
    assert rscfed.subconsensus_weights([1, 1], [1e6, 2e6], 1e4).tolist() == [1.0, 0.0]


def test_rscfed_identical_clients_give_that_model():
    s = {"w": torch.tensor([1.5, -2.0])}
    model, _ = rscfed.group_consensus([s, dict(s), dict(s)], [3, 1, 5], 0.01)
    assert torch.allclose(model["w"], s["w"])


def test_rscfed_ema_and_missing_mse_by_hand():
    t, s = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    with torch.no_grad():
        t.weight.zero_(), t.bias.zero_(), s.weight.fill_(1.0), s.bias.fill_(1.0)
    OneCopy(t, s).ema_(0.999, torch.ones(1, dtype=torch.bool))  # the engine's teacher copy, K = 1
    assert t.weight.item() == pytest.approx(0.001) and t.bias.item() == pytest.approx(0.001)
    ps, pt = torch.tensor([[0.5, 0.9], [0.2, 0.4]]), torch.tensor([[0.1, 0.5], [0.3, 0.2]])
    # class 1 missing only: (0.4^2 + 0.2^2) / (2 samples * 1 class)
    assert rscfed.missing_mse(ps, pt, torch.tensor([0.0, 1.0])).item() == pytest.approx(0.1)
    assert rscfed.missing_mse(ps, pt, torch.zeros(2)).item() == 0.0


def test_rscfed_group_larger_than_the_clients_is_a_clear_error():
    ctx = make_ctx(multi_label=True)  # 4 clients
    with pytest.raises(ConfigError, match="group_size=6.*4 clients.*4 for ICH"):
        METHODS["rscfed"](method_from_dict({"name": "rscfed"}), ctx)


def test_rscfed_groups_and_plain_mean_of_subconsensus_models():
    ctx = make_ctx(multi_label=True)
    m = METHODS["rscfed"](method_from_dict({"name": "rscfed", "group_size": 3, "num_groups": 5}), ctx)
    m.select_clients(0)
    assert len(m.groups) == 5 and all(len(set(g)) == 3 for g in m.groups)
    # scalar-valued states 0, 2, 4 (every float entry), equal sizes; groups {0,1} and {1,2}
    base = snapshot(m.global_model)
    states = [{k: torch.full_like(v, 2.0 * i) if v.is_floating_point() else v for k, v in base.items()} for i in range(3)]
    m.groups = [[0, 1], [1, 2]]
    m.aggregate(0, (ClientUpdate(i, 10, {"model": states[i]}) for i in range(3)))
    w = next(v for v in m.global_model.state_dict().values() if v.is_floating_point())
    assert torch.allclose(w, torch.full_like(w, 2.0))  # mean of the sub-consensus models 1 and 3


def test_fedirm_ramp_by_hand():
    assert fedirm.ramp_weight(0) == pytest.approx(math.exp(-5))  # 0.0067
    assert fedirm.ramp_weight(15) == pytest.approx(math.exp(-1.25))  # 0.2865
    assert fedirm.ramp_weight(30) == 1.0 and fedirm.ramp_weight(45) == 1.0
    assert fedirm.ramp_weight(3, consistency=2.0, ramp_rounds=0) == 2.0


def test_fedirm_relation_matrix_and_server_average_by_hand():
    rows, has = fedirm.relation_rows(torch.tensor([[2.0, 0.0]]), torch.tensor([[True, False]]))
    assert rows.tolist()[0] == pytest.approx([0.7310586, 0.5]) and rows.tolist()[1] == [0.5, 0.5]
    assert has.tolist() == [True, False]
    rows, _ = fedirm.relation_rows(torch.tensor([[2.0, 0.0], [0.0, 4.0]]), torch.tensor([[False, True], [False, True]]))
    assert rows[1].tolist() == pytest.approx([0.6224593, 0.7310586])  # sigma(mean [1, 2] / 2)
    a = torch.tensor([[0.8, 0.4], [0.5, 0.5]])
    b = torch.tensor([[0.6, 0.2], [0.3, 0.9]])
    g = fedirm.aggregate_relations([a, b], [1, 3], [torch.tensor([True, False]), torch.tensor([True, True])])
    assert g[0].tolist() == pytest.approx([0.65, 0.25]) and g[1].tolist() == pytest.approx([0.3, 0.9])
    g = fedirm.aggregate_relations([a], [1], [torch.tensor([True, False])])
    assert g[1].tolist() == [0.5, 0.5]  # nobody labels class 1


def test_fedirm_symmetric_kl_mask_and_ema_alpha_by_hand():
    m = torch.tensor([[0.7, 0.2], [0.4, 0.4]])
    assert fedirm.relation_kl(m, m.clone()).item() == pytest.approx(0.0, abs=1e-7)
    # rows normalised: [0.6, 0.2] -> [0.75, 0.25] vs [0.5, 0.5]; KL = 0.130812 and 0.143841
    kl = fedirm.relation_kl(torch.tensor([[0.6, 0.2]]), torch.tensor([[0.5, 0.5]])).item()
    assert kl == pytest.approx(0.1373265, abs=1e-6)
    p = torch.tensor([[0.9, 0.1], [0.9, 0.5], [0.99, 0.01]])
    assert fedirm.confident_mask(p, 0.7, 0.3, 2.0).tolist() == [True, False, True]
    # summed binary entropy: 2 H(0.9) = 0.650 > 0.5, 2 H(0.99) = 0.112
    assert fedirm.confident_mask(p, 0.7, 0.3, 0.5).tolist() == [False, False, True]
    steps = torch.tensor([0.0, 1.0, 1000.0], dtype=torch.float64)  # the chunk's counters (relation_after_step)
    assert fedirm.ema_alpha(steps, 0.99).tolist() == [0.0, 0.5, 0.99]


def test_cbafed_thresholds_and_residual_by_hand():
    tau = cbafed.class_thresholds(torch.tensor([1.0, 3.0, 2.0]), 10.0, 0.45, 0.55, 0.95)
    assert tau.tolist() == pytest.approx([0.55, 0.65, 0.55])  # p + 0.45 - 0.1 = [0.45, 0.65, 0.55], clipped
    tau = cbafed.class_thresholds(torch.tensor([9.0, 1.0]), 10.0, 0.45, 0.55, 0.95)
    assert tau.tolist() == pytest.approx([0.784315, 0.55], abs=1e-6)  # std 0.565685: [0.784315, -0.015685]
    new, rec = {"w": torch.tensor([1.0])}, {"w": torch.tensor([0.0])}
    assert cbafed.residual_mix(new, rec, 0.2)["w"].item() == pytest.approx(0.2)
    assert cbafed.residual_mix(new, rec, 0.5)["w"].item() == pytest.approx(0.5)


def test_cbafed_pseudo_label_selection_and_loss_by_hand():
    p = torch.tensor([[0.9, 0.9], [0.15, 0.5], [0.5, 0.7]])
    pos, neg = cbafed.select_missing(p, torch.tensor([0.8, 0.6]), torch.tensor([1.0, 0.0]))
    assert pos.tolist() == [[True, False], [False, False], [False, False]]
    assert neg.tolist() == [[False, False], [True, False], [False, False]]  # 1 - 0.8 = 0.2; class 1 annotated
    z = torch.tensor([[2.0, 0.0], [-1.0, 0.0], [0.0, 0.0]])
    # class 0: P = {0}, Q = {1}: pw = 2 / 1; (2 softplus(-2) + softplus(-1)) / 2; class 1: nothing selected
    loss = cbafed.missing_class_loss(z[None], pos[None], neg[None])  # one client (K = 1) -> (1,)
    assert loss.shape == (1,) and loss.item() == pytest.approx((2 * 0.126928 + 0.313262) / 2, abs=1e-5)


def test_cbafed_residual_aggregation_schedule():
    ctx = make_ctx(TrainSettings(rounds=8, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3), multi_label=True)
    m = METHODS["cbafed"](method_from_dict({"name": "cbafed", "warmup_rounds": 3, "period": 2}), ctx)
    base = snapshot(m.global_model)
    got = []
    counts = torch.tensor([1.0, 3.0, 2.0, 4.0], dtype=torch.float64)
    for r, v in enumerate([1.0, 2.0, 3.0, 5.0, 6.0, 7.0]):
        m.begin_round(r)
        state = {k: torch.full_like(x, v) if x.is_floating_point() else x for k, x in base.items()}
        m.aggregate(r, [ClientUpdate(0, 10, {"model": state}, {"counts": counts, "data": 10.0, "pseudo": 0.0})])
        w = next(x for x in m.global_model.state_dict().values() if x.is_floating_point())
        got.append(w.flatten()[0].item())
    # r0: w_rec = 1; r1: plain; r2: 0.2*3 + 0.8*1; r3 (= warm-up): reset w_rec = 5; r4: plain; r5: 0.5*7 + 0.5*5
    assert got == pytest.approx([1.0, 2.0, 1.4, 5.0, 6.0, 6.0])
    assert m.thresholds is not None and m.thresholds.tolist() == pytest.approx([0.55, 0.6209, 0.55, 0.7209], abs=1e-4)


def _run2(name, **kw):
    ctx = make_ctx(TrainSettings(rounds=2, local_epochs=1, batch_size=32, optimizer="adam", lr=3e-3), multi_label=True)
    m = METHODS[name](method_from_dict({"name": name, **kw}), ctx)
    return Simulation(m, ctx, progress=lambda s: None).run(), m


def test_rscfed_two_rounds_keep_a_persistent_teacher():
    df, m = _run2("rscfed", group_size=3, num_groups=4)
    assert df["bacc"].notna().all() and len(df) == 2
    g = m.global_model.state_dict()
    key = next(k for k, v in g.items() if v.is_floating_point())
    init = METHODS["rscfed"](method_from_dict({"name": "rscfed", "group_size": 3}), make_ctx(multi_label=True))
    t0 = init.teachers.get(0)[key]
    assert m.teachers.clients() == list(range(4))
    for t in map(m.teachers.get, m.teachers.clients()):  # moved away from the initial model, never reset to the global one
        assert not torch.equal(t[key], t0) and not torch.equal(t[key], g[key])
        assert (t[key] - t0).abs().max() < (g[key] - t0).abs().max()  # decay 0.999: a small step


def test_fedirm_two_rounds_match_relations_after_the_supervised_round():
    df, m = _run2("fedirm", sup_rounds=1, ramp_rounds=2)
    assert df["stage"].tolist() == ["supervised", "relation"] and df["bacc"].notna().all()
    assert m.relation_g.shape == (4, 4) and ((m.relation_g > 0) & (m.relation_g < 1)).all()
    assert m.teachers.clients() == list(range(4)) and all(s > 0 for s in m.steps)
    assert 0 <= df["fedirm_masked_share"].iloc[1] <= 1


def test_cbafed_two_rounds_pseudo_label_missing_classes():
    df, m = _run2("cbafed", warmup_rounds=1)
    assert df["stage"].tolist() == ["warmup", "pseudo"] and df["bacc"].notna().all()
    taus = df[[f"cbafed_tau_{c}" for c in range(4)]].to_numpy()
    assert ((taus >= 0.55) & (taus <= 0.95)).all()
    # warm-up: each class is annotated by 2 of the 4 clients (missing = 2): p = 0.25 each, std 0 -> 0.7
    assert taus[0].tolist() == pytest.approx([0.7] * 4)
    assert df["cbafed_pseudo_labels"].iloc[1] > 0


def test_rscfed_distance_is_the_sum_of_per_tensor_norms():
    from fnlcore.fl.state import per_tensor_distance

    a = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0]), "n": torch.tensor(3)}
    b = {"w": torch.zeros(2), "b": torch.tensor([-1.0]), "n": torch.tensor(5)}
    assert rscfed._distance(a, b) == pytest.approx(7.0) == per_tensor_distance(a, b)  # 5 + 2
