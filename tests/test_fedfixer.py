"""FedFixer (baselines.md §11): the pure parts on hand-computed cases, then short runs and switches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS
from fnlcore.methods.fedfixer import (
    FedFixerParams,
    beta_schedule,
    clean_for,
    cr_losses,
    mix_aggregate,
    move_towards,
    selected_mean,
    twin_step,
)

from .engine_helpers import make_ctx

B = torch.tensor


def test_cr_sieve_by_hand():
    logits = torch.log(B([[0.7, 0.2, 0.1], [0.7, 0.2, 0.1]]))
    # CE(y=0) = 0.3567, mean −log p = 1.4229 → −1.0662 (clean); CE(y=2) = 2.3026 → +0.8797 (noisy)
    assert clean_for(logits, B([0, 2])).tolist() == [True, False]
    mean_nll = -(math.log(0.7) + math.log(0.2) + math.log(0.1)) / 3
    got = cr_losses(logits, B([0, 2]), beta=1.0)
    np.testing.assert_allclose(got.tolist(), [-math.log(0.7) - mean_nll, -math.log(0.1) - mean_nll], atol=1e-5)
    assert got[0].item() == pytest.approx(-1.0662, abs=1e-4) and got[1].item() == pytest.approx(0.8797, abs=1e-4)
    # uniform prediction: difference ~0 (only the 1e-8 inside the log) → clean
    assert clean_for(torch.zeros(1, 4), B([3])).tolist() == [True]
    # β = 0 (or cr off) is the plain cross-entropy
    ce = torch.nn.functional.cross_entropy(logits, B([0, 2]), reduction="none")
    assert torch.allclose(cr_losses(logits, B([0, 2]), 0.0), ce)
    assert torch.equal(cr_losses(logits, B([0, 2]), 5.0, cr=False), ce)


def test_beta_schedule_by_hand():
    # E = 10, begin_sel = 10: 20 zero epochs, linspace(0, β_max, 100), then β_max
    b = lambda e: beta_schedule(e, 10, 10, 2.0)  # noqa: E731
    assert [b(e) for e in (0, 19, 20)] == [0.0, 0.0, 0.0]
    assert b(70) == pytest.approx(2.0 * 50 / 99) and b(70) == pytest.approx(1.0, abs=0.02)
    assert b(119) == pytest.approx(2.0) and b(120) == 2.0 and b(5000) == 2.0
    assert b(21) == pytest.approx(2.0 / 99)


def test_selected_mean_and_empty_selection():
    losses = B([[1.0, 2.0, 4.0]], requires_grad=True)
    m, n = selected_mean(losses, B([[True, False, True]]))
    assert m.tolist() == [2.5] and n.tolist() == [2]
    m.sum().backward()  # the per-client code's gradient: 1/n on each selected sample
    assert losses.grad.tolist() == [[0.5, 0.0, 0.5]]
    losses.grad = None
    m, n = selected_mean(losses, B([[False, False, False]]))
    assert m.item() == pytest.approx(7.0 / 3 / 1e8) and n.tolist() == [0]
    m.sum().backward()  # the 'none selected' branch: no NaN from the other one
    assert torch.allclose(losses.grad, torch.full((1, 3), 1 / 3 / 1e8))
    # two clients, the second's last row padding (never selected, not in its empty-branch mean)
    two = B([[1.0, 2.0, 4.0], [3.0, 5.0, 100.0]])
    m, n = selected_mean(two, B([[True, False, True], [False, False, True]]), B([[True] * 3, [True, True, False]]))
    assert m.tolist() == pytest.approx([2.5, 4.0 / 1e8]) and n.tolist() == [2, 0]


def test_twin_step_and_move_by_hand():
    theta = twin_step({"p": B([[1.0]])}, {"p": B([[0.5]])}, {"p": B([[0.0]])}, plr=0.1, lam=15.0, mu=0.001)
    assert theta["p"].item() == pytest.approx(-0.5501)  # 1 − 0.1 (0.5 + 15·1 + 0.001·1)
    w = move_towards({"p": B([[0.0]])}, theta, 15.0 * 0.01)  # 0 − 0.15 (0 + 0.5501)
    assert w["p"].item() == pytest.approx(-0.082515)
    # no gradient, no coupling, no decay: unchanged
    assert twin_step(theta, {"p": B([[0.0]])}, {"p": B([[0.0]])}, 0.1, 0.0, 0.0)["p"].item() == pytest.approx(-0.5501)
    # one rate per client (clients at different local epochs)
    two = twin_step({"p": B([[1.0], [1.0]])}, {"p": B([[0.5], [0.5]])}, {"p": B([[0.0], [0.0]])}, B([0.1, 0.2]), 15.0,
                    0.001)
    assert two["p"].view(-1).tolist() == pytest.approx([-0.5501, 1 - 0.2 * 15.501])


def test_server_mixing_by_hand():
    old = {"w": B([1.0]), "n": B(0)}
    states = [{"w": B([0.0]), "n": B(3)}, {"w": B([4.0]), "n": B(5)}]
    assert mix_aggregate(old, zip(states, [10.0, 30.0]), 1.0)["w"].item() == pytest.approx(3.0)
    assert mix_aggregate(old, zip(states, [10.0, 30.0]), 0.0)["w"].item() == 1.0  # old global unchanged
    assert mix_aggregate(old, zip(states, [10.0, 30.0]), 0.5)["w"].item() == pytest.approx(2.0)
    assert int(mix_aggregate(old, zip(states, [10.0, 30.0]), 1.0)["n"]) == 3
    assert mix_aggregate(old, zip(states, [0.0, 0.0]), 0.25)["w"].item() == pytest.approx(0.75)  # Σ n̄ = 0: (1 − γ) old
    assert int(mix_aggregate(old, iter(()), 1.0)["n"]) == 0  # no client: the old integers


def _run(params: FedFixerParams, rounds: int = 3):
    s = TrainSettings(rounds=rounds, local_epochs=1, batch_size=16, optimizer="sgd", lr=0.02, momentum=0.5,
                      client_fraction=0.5)
    ctx = make_ctx(s, seed=0, n_train=120, noisy_clients=(0, 1))
    m = METHODS["fedfixer"](params, ctx)
    return Simulation(m, ctx, progress=lambda x: None).run(), m, ctx


def test_cross_selection_after_begin_sel():
    m = METHODS["fedfixer"](FedFixerParams(begin_sel=1), make_ctx(n_train=40))
    y = B([0, 2])
    z_p = torch.log(B([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]]))  # θ: both clean
    z_g = torch.log(B([[0.1, 0.2, 0.7], [0.1, 0.2, 0.7]]))  # w: only sample 1 clean
    for_theta, for_w = m.select(z_p, z_g, y, r=1)
    assert for_theta.tolist() == [True, True] and for_w.tolist() == [True, True]  # r ≤ begin_sel: everything
    for_theta, for_w = m.select(z_p, z_g, y, r=2)
    assert for_theta.tolist() == [False, True] and for_w.tolist() == [True, True]  # each trains on its peer's set
    m = METHODS["fedfixer"](FedFixerParams(begin_sel=1, alternate=False), make_ctx(n_train=40))
    for_theta, for_w = m.select(z_p, z_g, y, r=2)
    assert for_theta.tolist() == [True, True] and for_w.tolist() == [False, True]


def test_a_short_run_sieves_after_begin_sel_and_keeps_no_personal_models():
    df, m, _ = _run(FedFixerParams(begin_sel=1, inner_steps=2))
    assert df["stage"].tolist() == ["early", "early", "sieve"]
    assert df["selected_frac"].tolist()[:2] == [1.0, 1.0] and 0 < df["selected_frac"].iloc[2] < 1
    assert np.isfinite(df["acc"]).all() and len(m.personal) == 0


def test_persistent_personal_models_are_kept_per_client_and_restored():
    df, m, ctx = _run(FedFixerParams(begin_sel=1, inner_steps=1, personalised="persistent", lam=0.0), rounds=2)
    assert np.isfinite(df["acc"]).all()
    kept = {k: m.personal.get(k) for k in m.personal.clients()}
    assert 1 <= len(kept) <= 4 and all(v.device.type == "cpu" for st in kept.values() for v in st.values())
    k = next(iter(kept))
    # λ = 0: the personalised model drifts from the global one
    g = m.global_model.state_dict()
    assert any(not torch.equal(v, g[n].cpu()) for n, v in kept[k].items() if v.is_floating_point())
    fresh = METHODS["fedfixer"](m.params, ctx)
    fresh.load_state_dict(m.state_dict())
    assert fresh.personal.clients() == m.personal.clients()
    assert all(torch.equal(fresh.personal.get(k)[n], v) for n, v in kept[k].items())


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_persistent_personal_models_survive_a_kill_and_resume(tmp_path, engine):
    params = FedFixerParams(begin_sel=0, inner_steps=1, personalised="persistent")
    s = TrainSettings(rounds=3, local_epochs=1, batch_size=16, optimizer="sgd", lr=0.02, momentum=0.5,
                      client_fraction=0.5, checkpoint_every=1, engine=engine)

    def run(**kw):
        ctx = make_ctx(s, seed=0, n_train=80, noisy_clients=(0, 1))
        m = METHODS["fedfixer"](params, ctx)
        return Simulation(m, ctx, progress=lambda x: None, **kw).run(), m

    full, m_full = run()
    ckpt = tmp_path / "c.pt"
    run(checkpoint_path=ckpt, stop_after=1)
    resumed, m_res = run(checkpoint_path=ckpt)
    cols = [c for c in full.columns if c != "seconds"]
    assert full[cols].equals(resumed[cols])
    assert m_res.personal.clients() == m_full.personal.clients()
    assert all(torch.equal(m_res.personal.get(k)[n], v) for k in m_full.personal.clients()
               for n, v in m_full.personal.get(k).items())
