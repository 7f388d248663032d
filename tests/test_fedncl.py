"""Fed-NCL (fedncl.md §1): hand-computed cases for each pure part, plus a short run on digits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods.fedncl import (
    FedNCL,
    FedNCLParams,
    confident_relabel,
    correction_members,
    detect_noisy,
    entry_distances,
    layer_weights,
    layerwise_average,
    penalty_factor,
    reliability_scores,
)
from tests.engine_helpers import make_ctx


def test_entry_distances_are_l2_plus_one_per_entry():
    g = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0]), "n": torch.tensor(4)}
    c1 = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0]), "n": torch.tensor(6)}
    c2 = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([3.0]), "n": torch.tensor(4)}
    d = entry_distances(g, [c1, c2], ["a", "b", "n"])
    # c1: ||(3,4)|| + 1 = 6, 0 + 1 = 1, |4 - 6| + 1 = 3 (the BN counter counts too); c2: 1, 3, 1
    assert torch.equal(d, torch.tensor([[6.0, 1.0], [1.0, 3.0], [3.0, 1.0]], dtype=torch.float64))


def test_reliability_scores_and_ablations():
    dist = torch.tensor([[6.0, 1.0], [1.0, 3.0]], dtype=torch.float64)  # e = (7, 4)
    losses, sizes = np.array([0.5, 2.0]), np.array([7, 2])
    np.testing.assert_allclose(reliability_scores(dist, losses, sizes), [7 * 0.5 / 7, 4 * 2.0 / 2])
    np.testing.assert_allclose(reliability_scores(dist, losses, sizes, use_divergence=False), [0.5 / 7, 1.0])
    np.testing.assert_allclose(reliability_scores(dist, losses, sizes, use_loss=False), [1.0, 2.0])


def test_detection_two_sided_code_and_one_sided_paper():
    q = np.array([1.0, 1.0, 1.0, 1.0, 6.0])  # mean 2, unbiased std sqrt(20 / 4) = 2.236
    assert detect_noisy(q, 0.6).tolist() == [False] * 4 + [True]  # 0.6 * 2.236 = 1.342
    # beta 0.4 -> 0.894: |1 - 2| = 1 exceeds it two-sided, not one-sided
    assert detect_noisy(q, 0.4).tolist() == [True] * 5
    assert detect_noisy(q, 0.4, two_sided=False).tolist() == [False] * 4 + [True]
    assert detect_noisy(np.array([3.0]), 0.0).tolist() == [False]  # one client: no std
    assert not detect_noisy(np.array([2.0, 2.0, 2.0]), 0.6).any()


def test_penalty_schedule_of_the_code():
    assert penalty_factor(0, 60, 10, 50) == 10  # clip(0/10, 10, 50)
    assert penalty_factor(60, 60, 10, 50) == 10
    assert penalty_factor(61, 60, 10, 50) == 50
    assert penalty_factor(150, 200, 10, 50) == 15  # clip(150/10, 10, 50) when T_corr is later


def test_layer_weights_divide_flagged_clients_by_m():
    dist = torch.tensor([[1.0, 2.0], [4.0, 4.0]], dtype=torch.float64)
    w = layer_weights(dist, np.array([False, True]), 10.0)
    # row 0: 1/1 and 1/20 -> 20/21, 1/21; row 1: 1/4 and 1/40 -> 10/11, 1/11
    torch.testing.assert_close(w, torch.tensor([[20 / 21, 1 / 21], [10 / 11, 1 / 11]], dtype=torch.float64))
    # paper Eq. 13: N^c / d, sizes (1, 3), no penalty: row 0 1 and 1.5 -> 0.4, 0.6
    wp = layer_weights(dist, np.array([False, False]), 1.0, sizes=np.array([1, 3]))
    torch.testing.assert_close(wp[0], torch.tensor([0.4, 0.6], dtype=torch.float64))
    torch.testing.assert_close(wp[1], torch.tensor([0.25, 0.75], dtype=torch.float64))


def test_layerwise_average_per_entry_and_integer_buffers():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(5)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(8)}
    w = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)
    out = layerwise_average([a, b], ["w", "n"], w)
    assert torch.equal(out["w"], torch.tensor([2.5, 5.0]))
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 6  # 6.5 truncated, as load_state_dict does


def test_correction_set_threshold_is_strict():
    assert correction_members(np.array([36, 37, 0]), 0.6, 60).tolist() == [False, True, False]
    assert correction_members(np.array([30, 31]), 0.5, 60).tolist() == [False, True]


def test_confident_relabel_keeps_unconfident_noisy_labels():
    probs = torch.tensor([[0.95, 0.05], [0.6, 0.4], [0.1, 0.9]])
    assert confident_relabel(probs, torch.tensor([1, 1, 0]), 0.9).tolist() == [0, 1, 1]  # 0.9 itself relabels


def test_params_checks():
    with pytest.raises(ConfigError, match="use_divergence"):
        FedNCLParams(use_divergence=False, use_loss=False).check_training(TrainSettings(rounds=100))
    with pytest.raises(ConfigError, match="correction_round"):
        FedNCLParams().check_training(TrainSettings(rounds=50))


SETTINGS = TrainSettings(rounds=4, local_epochs=1, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9, lr_decay=0.99)


def _run(noisy_clients=(0,), rate=1.0, **kw):
    ctx = make_ctx(SETTINGS, seed=0, noisy_clients=noisy_clients, rate=rate)
    params = FedNCLParams(correction_round=1, **kw)
    method = FedNCL(params, ctx)
    out = Simulation(method, ctx, progress=lambda s: None).run()
    return ctx, method, out


def test_short_run_detects_counts_and_relabels_from_original_labels():
    ctx, method, out = _run((0, 1, 2, 3), 0.5, beta=0.6, alpha=0.0, eta=0.2)  # alpha 0: one detection joins
    assert len(out) == 4 and out["acc"].notna().all()
    assert set(out["penalty"]) <= {1.0, 10.0, 50.0}
    assert (method.counts <= 1).all()  # counted in round 0 only (t < T_corr = 1)
    members = np.flatnonzero(method.in_correction)
    rel = ctx.data.relabels.frame()
    assert len(rel) and set(rel["round"]) <= {2, 3}  # correction only for t > T_corr
    assert set(rel["client"]) <= set(members.tolist())
    # unconfident samples keep the original noisy label: every label is either the original or changed by the log
    for k in range(ctx.data.num_clients):
        if k not in members:
            idx = ctx.data.clients[k]
            assert torch.equal(ctx.data.given[idx], method.original[idx])


def test_relabel_restarts_from_the_original_labels():
    ctx = make_ctx(SETTINGS, seed=0, noisy_clients=(0,), rate=1.0)
    method = FedNCL(FedNCLParams(correction_round=1, eta=0.0), ctx)  # eta 0: every sample takes the arg-max
    idx = ctx.data.clients[0]
    ctx.data.given[idx] = (ctx.data.given[idx] + 3) % 10  # a stale earlier relabel
    method.relabel_client(2, 0)
    first = ctx.data.given[idx].clone()
    method.relabel_client(3, 0)
    assert torch.equal(ctx.data.given[idx], first)  # same global model -> same labels, not cumulative
    no_conf = FedNCL(FedNCLParams(correction_round=1, eta=1.0 + 0.0), ctx)
    no_conf.original = method.original
    no_conf.relabel_client(4, 0)  # eta 1: no sample is that confident -> back to the original noisy labels
    assert torch.equal(ctx.data.given[idx], method.original[idx])


def test_ablation_without_penalty_keeps_m_one():
    _, _, out = _run(use_penalty=False, use_label_correction=False)
    assert (out["penalty"] == 1.0).all()


def test_identical_clients_aggregate_to_their_model():
    ctx = make_ctx(SETTINGS, seed=0)
    method = FedNCL(FedNCLParams(correction_round=1), ctx)
    st = {k: v.clone() + (1 if v.is_floating_point() else 0) for k, v in method.global_model.state_dict().items()}
    from fnlcore.fl.contract import ClientUpdate

    method.begin_round(0)
    method.aggregate(0, (ClientUpdate(k, 10, {"model": st}, {"train_loss": 1.0}) for k in range(4)))
    for k, v in method.global_model.state_dict().items():
        assert torch.allclose(v.double(), st[k].double()), k
    assert not math.isnan(method.round_info["penalty"])
