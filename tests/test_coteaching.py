"""FL-Coteaching (baselines.md §9): the schedule, the exchange, tau = 0 is per-network CE, a short run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fnlcore.errors import ConfigError
from fnlcore.fl.sequential import train_client, train_epochs
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.state import load, snapshot
from fnlcore.methods.coteaching import Coteaching, CoteachingParams, exchanged_losses, keep_rate, small_loss_masks

from .engine_helpers import make_ctx


def test_drop_rate_schedule():
    drop = [1 - keep_rate(r, 0.3, 25) for r in (0, 10, 25, 40)]
    assert drop == pytest.approx([0.0, 0.12, 0.3, 0.3])
    assert keep_rate(5, 0.5, 10, c=2) == 0.5  # min(25 / 10, 1) = 1


def test_exchange_trains_each_network_on_the_peers_small_loss_samples():
    l1 = torch.tensor([0.1, 0.5, 0.9, 2.0], requires_grad=True)
    l2 = torch.tensor([0.8, 0.2, 0.3, 1.5], requires_grad=True)
    two = torch.tensor([2.0])  # K = 1 client keeping m = 2
    assert small_loss_masks(l1[None], two, None)[0].tolist() == [True, True, False, False]
    assert small_loss_masks(l2[None], two, None)[0].tolist() == [False, True, True, False]
    a, b = exchanged_losses(l1[None], l2[None], two, None)
    assert a.item() == pytest.approx(0.7) and b.item() == pytest.approx(0.5)
    (a + b).sum().backward()
    assert l1.grad.tolist() == [0.0, 0.5, 0.5, 0.0]  # net1 updated on samples {1, 2}
    assert l2.grad.tolist() == [0.5, 0.5, 0.0, 0.0]  # net2 on {0, 1}
    full = exchanged_losses(l1[None], l2[None], torch.tensor([4.0]), None)
    assert full[0].item() == pytest.approx(l1.mean().item()) and full[1].item() == pytest.approx(l2.mean().item())


def test_tau_is_required_and_bounded():
    with pytest.raises(TypeError):
        CoteachingParams()
    with pytest.raises(ConfigError):
        CoteachingParams(tau=1.5)


SETTINGS = TrainSettings(rounds=2, local_epochs=2, batch_size=16, optimizer="adam", lr=3e-3)


def test_tau_zero_trains_each_network_with_plain_ce():
    ctx = make_ctx(SETTINGS)
    m = Coteaching(CoteachingParams(tau=0.0), ctx)
    rng = ctx.rng_state()
    m.begin_round(0)
    upd = train_client(m, 0, 1)
    ctx.load_rng_state(rng)
    for name in ("net1", "net2"):
        net = ctx.new_model()
        load(net, m.globals[name].state_dict())
        ctx.load_rng_state(rng)  # the same batches as the pair saw
        train_epochs(ctx, net, ctx.data.clients[1], lambda mm, x, i, s: F.cross_entropy(mm(x), ctx.data.given[i]), 0,
                     optimizer=ctx.optimizer(net.parameters(), 0))
        for key, v in snapshot(net).items():
            assert torch.allclose(v, upd.states[name][key], atol=1e-6), (name, key)


def test_noisy_only_scope_gives_clean_clients_no_drop():
    ctx = make_ctx(SETTINGS)  # client 0 noisy
    m = Coteaching(CoteachingParams(tau=0.3, tau_scope="noisy_only"), ctx)
    assert m.noisy_clients == frozenset({0})
    assert m.client_tau(0) == 0.3 and m.client_tau(1) == 0.0
    assert Coteaching(CoteachingParams(tau=0.3), ctx).client_tau(1) == 0.3


def test_a_short_run_drops_on_schedule_and_logs_both_networks(tmp_path):
    ctx = make_ctx(SETTINGS)
    m = Coteaching(CoteachingParams(tau=0.5, t_k=1), ctx)
    df = Simulation(m, ctx, tmp_path / "ck.pt", progress=lambda s: None).run()
    assert df["keep_rate"].tolist() == [1.0, 0.5]
    assert {"acc", "net2_acc"} <= set(df.columns) and df["acc"].notna().all()
    assert m.eval_model() is m.globals["net1"]
    assert not torch.equal(m.globals["net1"].state_dict()["head.weight"], m.globals["net2"].state_dict()["head.weight"])
