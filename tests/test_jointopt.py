"""JointOpt (baselines.md §13): the spec's 'Test' cases as unit tests plus a short run."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.methods.jointopt import (
    entropy_penalty, history_mean, jointopt_loss, prior_penalty, record_predictions, soft_cross_entropy,
)

from .engine_helpers import make_ctx


def test_prior_term_is_zero_for_a_uniform_batch_mean():
    assert float(prior_penalty(torch.tensor([[0.7, 0.3], [0.3, 0.7]]))) == pytest.approx(0.0, abs=1e-7)
    # mean [0.9, 0.1]: 0.5 (log 0.5 - log 0.9) + 0.5 (log 0.5 - log 0.1)
    expect = 0.5 * (math.log(0.5 / 0.9) + math.log(0.5 / 0.1))
    assert float(prior_penalty(torch.tensor([[0.9, 0.1]]))) == pytest.approx(expect, abs=1e-6)


def test_entropy_term_is_zero_for_one_hot_predictions():
    one_hot = F.log_softmax(torch.tensor([[80.0, 0.0, 0.0], [0.0, 0.0, 80.0]]), 1)
    assert float(entropy_penalty(one_hot)) == pytest.approx(0.0, abs=1e-6)
    uniform = F.log_softmax(torch.zeros(2, 4), 1)
    assert float(entropy_penalty(uniform)) == pytest.approx(math.log(4), abs=1e-6)


def test_soft_cross_entropy_with_one_hot_labels_is_ce():
    z = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 2, 1, 0])
    assert torch.allclose(soft_cross_entropy(F.log_softmax(z, 1), F.one_hot(y, 3).float()), F.cross_entropy(z, y))
    # soft target [0.5, 0.5] on logits [0, log 3]: -(0.5 log 0.25 + 0.5 log 0.75)
    val = soft_cross_entropy(F.log_softmax(torch.tensor([[0.0, math.log(3)]]), 1), torch.tensor([[0.5, 0.5]]))
    assert float(val) == pytest.approx(-(0.5 * math.log(0.25) + 0.5 * math.log(0.75)), abs=1e-6)


def test_loss_is_the_weighted_sum_of_its_terms():
    z = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    soft = torch.tensor([[1.0, 0.0], [0.3, 0.7]])
    lp = F.log_softmax(z, 1)
    expect = soft_cross_entropy(lp, soft) + 1.2 * prior_penalty(lp.exp()) + 0.8 * entropy_penalty(lp)
    assert torch.allclose(jointopt_loss(z, soft, 1.2, 0.8), expect)
    assert torch.allclose(jointopt_loss(z, soft, 0.0, 0.0), soft_cross_entropy(lp, soft))


def test_history_mean_hand_case_and_ring_buffer():
    hist = torch.zeros(1, 10, 2)
    counts = torch.zeros(1, dtype=torch.int64)
    idx = torch.tensor([0])
    record_predictions(hist, counts, idx, torch.tensor([[0.6, 0.4]]))
    record_predictions(hist, counts, idx, torch.tensor([[0.8, 0.2]]))
    assert torch.allclose(history_mean(hist, counts), torch.tensor([[0.7, 0.3]]))
    # Q = 2: a third record overwrites the oldest, the mean is over the last two
    hist, counts = torch.zeros(2, 2, 2), torch.zeros(2, dtype=torch.int64)
    for p in ([0.6, 0.4], [0.8, 0.2], [1.0, 0.0]):
        record_predictions(hist, counts, idx, torch.tensor([p]))
    assert torch.allclose(history_mean(hist, counts)[0], torch.tensor([0.9, 0.1]))
    assert counts.tolist() == [3, 0] and torch.equal(history_mean(hist, counts)[1], torch.zeros(2))


def test_check_training_rejects_a_warm_up_as_long_as_the_run():
    p = method_from_dict({"name": "jointopt", "warmup_rounds": 5})
    p.check_training(TrainSettings(rounds=6))
    with pytest.raises(ConfigError, match="warmup_rounds"):
        p.check_training(TrainSettings(rounds=5))


def _sim(stop_after=None):
    s = TrainSettings(rounds=3, local_epochs=2, batch_size=32, optimizer="adam", lr=3e-3)
    ctx = make_ctx(s, seed=0)
    given0 = ctx.data.given.clone()
    m = METHODS["jointopt"](method_from_dict({"name": "jointopt", "warmup_rounds": 2, "history": 3}), ctx)
    return m, ctx, given0, Simulation(m, ctx, progress=lambda s: None, stop_after=stop_after)


def test_labels_never_change_before_warm_up_ends():
    m, ctx, given0, sim = _sim(stop_after=2)
    df = sim.run()
    assert list(df["stage"]) == ["warmup", "warmup"]
    assert torch.equal(m.soft, F.one_hot(given0, 10).float())
    assert torch.equal(ctx.data.given, given0) and len(ctx.data.relabels) == 0
    assert int(m.counts.min()) == 4  # 2 rounds x 2 epochs recorded


def test_short_run_updates_soft_labels_after_warm_up():
    m, ctx, given0, sim = _sim()
    df = sim.run()
    assert list(df["stage"]) == ["warmup", "warmup", "joint"] and np.isfinite(df["acc"]).all()
    assert df["acc"].iloc[-1] > 0.3
    assert not torch.equal(m.soft, F.one_hot(given0, 10).float())
    assert torch.allclose(m.soft.sum(1), torch.ones(len(m.soft)), atol=1e-5)
    # the soft labels are the mean of the last Q = 3 recorded predictions
    assert torch.allclose(m.soft, m.history.mean(1), atol=1e-6)
    assert torch.equal(ctx.data.given, m.soft.argmax(1))
    assert 0 < df["soft_label_acc"].iloc[-1] <= 1
