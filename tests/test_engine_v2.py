"""Engine v2 capabilities, one test (or more) each: views, RandAugment, mixup, epoch hooks,
several networks per client, several batch streams, features, should_evaluate, LR schedules."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fnlcore.errors import ConfigError
from fnlcore.fl.local import train_epochs, train_streams
from fnlcore.fl.pipeline import InputPipeline
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.state import snapshot
from fnlcore.methods.base import MethodParams, MultiNetwork
from fnlcore.methods.fedavg import FedAvg, FedAvgParams
from fnlcore.models import build_model
from fnlcore.randaugment import OP_NAMES, RandAugmentSpec, cutout, equalize, mixup, rand_augment, _colour_op

from .engine_helpers import make_ctx


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _images(n=32, c=3, size=16, seed=0):
    return torch.randint(0, 256, (n, c, size, size), dtype=torch.uint8, generator=_gen(seed))


# -- RandAugment, Cutout, mixup ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fixmatch_mc", "fixmatch_pc"])
def test_rand_augment_keeps_shape_dtype_and_is_seeded(kind):
    x = _images()
    spec = RandAugmentSpec(kind, n=3, m=10)
    a = rand_augment(x, spec, _gen(1))
    b = rand_augment(x, spec, _gen(1))
    c = rand_augment(x, spec, _gen(2))
    assert a.dtype == torch.uint8 and a.shape == x.shape
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rand_augment_rejects_bad_parameters_by_name():
    with pytest.raises(ConfigError, match="kind='autoaugment'"):
        RandAugmentSpec("autoaugment")
    with pytest.raises(ConfigError, match="m=11"):
        RandAugmentSpec(m=11)


def test_rand_augment_draws_every_op_about_equally_often(monkeypatch):
    import fnlcore.randaugment as ra

    seen = []
    real = ra._apply_slot
    monkeypatch.setattr(ra, "_apply_slot", lambda x, op, *a: (seen.append(op.clone()), real(x, op, *a))[1])
    rand_augment(_images(n=2800, size=8), RandAugmentSpec("fixmatch_pc", n=1), _gen(0))
    counts = torch.bincount(seen[0], minlength=len(OP_NAMES)).float()
    assert counts.min() > 0.7 * 200 and counts.max() < 1.3 * 200  # 2800 / 14 = 200 expected


def test_colour_ops_by_hand():
    x = torch.tensor([[[[0.0, 100.0], [200.0, 255.0]]]])  # (1, 1, 2, 2)
    v = torch.tensor([0.5])  # enhance factor 1.8 * 0.5 + 0.1 = 1.0: identity
    for name in ("brightness", "contrast", "color", "sharpness"):
        assert torch.allclose(_colour_op(name, x, v), x)
    assert _colour_op("solarize", x, torch.tensor([128.0])).flatten().tolist() == [0.0, 100.0, 55.0, 0.0]
    assert _colour_op("posterize", x, torch.tensor([4.0])).flatten().tolist() == [0.0, 96.0, 192.0, 240.0]
    ac = _colour_op("autocontrast", torch.tensor([[[[50.0, 100.0], [150.0, 50.0]]]]), v)
    assert ac.flatten().tolist() == [0.0, 127.5, 255.0, 0.0]
    assert torch.equal(_colour_op("brightness", x, torch.tensor([0.0])), x * 0.1)


def test_equalize_spreads_a_two_level_image():
    x = torch.tensor([[[[10.0, 10.0], [20.0, 20.0]]]])
    # PIL: step = (4 - 2) // 255 = 0 -> unchanged
    assert torch.equal(equalize(x), x)
    x = torch.arange(4096.0).view(1, 1, 64, 64) // 32  # 32 pixels per value 0..127
    y = equalize(x)
    # PIL: step = (4096 - 32) // 255 = 15; lut[v] = (32 v + 7) // 15
    assert y.flatten()[::32].tolist() == [min((32 * v + 7) // 15, 255) for v in range(128)]
    assert y.max() == 255 and torch.equal(torch.argsort(y.flatten(), stable=True), torch.argsort(x.flatten(), stable=True))


def test_cutout_fills_a_square_of_the_given_side():
    x = torch.zeros(4, 3, 32, 32)
    out = cutout(x, torch.full((4,), 16.0), (125.0, 123.0, 114.0), _gen(0))
    filled = (out[:, 0] == 125).sum(dim=(1, 2))
    assert (filled <= 256).all() and (filled > 0).all()
    assert torch.equal(out[:, 1][out[:, 0] == 125], torch.full_like(out[:, 1][out[:, 0] == 125], 123.0))


def test_mixup_mixes_pairs_with_one_seeded_lambda():
    x = torch.randn(8, 3, 4, 4)
    y = torch.arange(8)
    xm, ya, yb, lam = mixup(x, y, 1.0, _gen(3))
    xm2, _, yb2, lam2 = mixup(x, y, 1.0, _gen(3))
    assert lam == lam2 and torch.equal(yb, yb2) and 0 < lam < 1
    assert torch.allclose(xm, lam * x + (1 - lam) * x[yb])  # y = arange: yb is the permutation
    with pytest.raises(ConfigError):
        mixup(x, y, 0.0)


# -- named views ---------------------------------------------------------------------------


def test_views_of_one_batch_are_independent_draws():
    p = InputPipeline(mean=(0.5,) * 3, std=(0.5,) * 3, augmentation="crop_flip", strong=RandAugmentSpec("fixmatch_mc", 2, 10))
    x = _images()
    v = p.views(x, _gen(0), ("eval", "weak:1", "weak:2", "strong"))
    assert set(v) == {"eval", "weak:1", "weak:2", "strong"}
    assert torch.equal(v["eval"], p.eval(x))
    assert not torch.equal(v["weak:1"], v["weak:2"])
    assert all(t.shape == (32, 3, 16, 16) and t.dtype == torch.float32 for t in v.values())
    with pytest.raises(ConfigError, match="view 'medium'"):
        p.view("medium", x, None)


# -- local training: epoch hook, streams ---------------------------------------------------


def test_epoch_hook_runs_before_each_epoch_and_may_change_labels():
    ctx = make_ctx(TrainSettings(rounds=1, local_epochs=3, batch_size=50))
    model = ctx.new_model()
    seen = []

    def hook(epoch):
        seen.append((epoch, model.training))
        model.eval()  # an evaluation pass; the loop must switch back to train mode

    modes = []

    def loss(m, x, idx, step):
        modes.append(m.training)
        return F.cross_entropy(m(x), ctx.data.given[idx])

    train_epochs(ctx, model, ctx.data.clients[0], loss, 0, on_epoch_start=hook)
    assert [e for e, _ in seen] == [0, 1, 2] and all(modes)


def test_streams_run_the_first_stream_length_and_cycle_the_others():
    ctx = make_ctx(TrainSettings(rounds=1, local_epochs=2, batch_size=16))
    idx = ctx.data.clients[0]  # 100 samples
    lab, unl = idx[:70], idx[70:]
    model = ctx.new_model()
    calls = []

    def loss(m, batches, step):
        (xl, il), (xu, iu) = batches["labelled"], batches["unlabelled"]
        calls.append((len(il), len(iu)))
        assert set(iu.tolist()) <= set(unl.tolist()) and set(il.tolist()) <= set(lab.tolist())
        v = ctx.pipeline.views(xu, ctx.aug_gen, ("weak", "strong"))
        return F.cross_entropy(m(ctx.pipeline.train(xl, ctx.aug_gen)), ctx.data.given[il]) + 0 * m(v["strong"]).sum()

    train_streams(ctx, model, {"labelled": (lab, 20), "unlabelled": (unl, 8)}, loss, 0)
    assert len(calls) == 2 * math.ceil(70 / 20)
    assert [c[0] for c in calls[:4]] == [20, 20, 20, 10] and all(u == 8 or u == 30 % 8 for _, u in calls)


# -- several networks per client -----------------------------------------------------------


@dataclass(frozen=True)
class _TwoNetParams(MethodParams):
    name = "test_two_nets"


class _TwoNets(MultiNetwork):
    Params = _TwoNetParams
    network_names = ("a", "b")

    def optimizer_for(self, name, params, r):
        lr = 0.01 if name == "a" else 0.0  # 'b' never moves: its own optimiser and schedule
        return torch.optim.SGD(params, lr=lr)


def test_multi_network_trains_each_with_its_own_optimiser_and_aggregates_by_name(tmp_path):
    ctx = make_ctx(TrainSettings(rounds=2, local_epochs=1, batch_size=32))
    m = _TwoNets(_TwoNetParams(), ctx)
    b0 = snapshot(m.globals["b"])
    a0 = snapshot(m.globals["a"])
    Simulation(m, ctx, tmp_path / "ck.pt", progress=lambda s: None).run()
    assert all(torch.equal(b0[k], v) for k, v in m.globals["b"].state_dict().items())
    assert any(not torch.equal(a0[k], v) for k, v in m.globals["a"].state_dict().items())
    st = m.state_dict()
    assert set(st["globals"]) == {"a", "b"}
    m2 = _TwoNets(_TwoNetParams(), make_ctx(TrainSettings(rounds=2, local_epochs=1, batch_size=32)))
    m2.load_state_dict(st)
    assert all(torch.equal(st["globals"]["a"][k], v) for k, v in m2.globals["a"].state_dict().items())


def test_multi_network_average_by_name_equals_separate_averages():
    ctx = make_ctx(TrainSettings(rounds=1, local_epochs=1, batch_size=32))
    m = _TwoNets(_TwoNetParams(), ctx)
    m.begin_round(0)
    ups = [m.local_update(0, k) for k in range(2)]
    for u in ups:
        m.accumulate(0, u)
    m.aggregate(0)
    w = np.array([u.num_samples for u in ups], dtype=float)
    w /= w.sum()
    for name in ("a", "b"):
        for key, v in m.globals[name].state_dict().items():
            if v.is_floating_point():
                expect = sum(wi * u.state[name][key].double() for wi, u in zip(w, ups))
                assert torch.allclose(v.double(), expect, atol=1e-6)


# -- features, should_evaluate, schedules --------------------------------------------------


def test_forward_features_gives_the_penultimate_layer():
    model = build_model("lenet5", 10, 1, (28, 28))
    x = torch.randn(5, 1, 28, 28)
    logits, feats = model.forward_features(x)
    assert feats.shape == (5, model.feature_dim)
    assert torch.allclose(logits, model(x)) and torch.allclose(model.head(feats), logits)


class _EveryOther(FedAvg):
    def should_evaluate(self, r):
        return r % 2 == 1


def test_rounds_not_evaluated_keep_their_row_with_nan_metrics(tmp_path):
    ctx = make_ctx(TrainSettings(rounds=4, local_epochs=1, batch_size=32))
    df = Simulation(_EveryOther(FedAvgParams(), ctx), ctx, tmp_path / "c.pt", progress=lambda s: None).run()
    assert df["round"].tolist() == [0, 1, 2, 3]
    assert df["acc"].isna().tolist() == [True, False, True, False]


def test_lr_schedules():
    s = TrainSettings(rounds=10, lr=0.1, lr_schedule="step", lr_milestones=[3, 6], lr_gamma=0.5)
    assert [s.lr_at(r) for r in (0, 2, 3, 5, 6, 9)] == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    c = TrainSettings(rounds=10, lr=0.2, lr_schedule="cosine")
    assert c.lr_at(0) == pytest.approx(0.2) and c.lr_at(5) == pytest.approx(0.1)
    e = TrainSettings(lr=0.1, lr_decay=0.99)
    assert e.lr_at(2) == pytest.approx(0.1 * 0.99**2)
    with pytest.raises(ConfigError, match="lr_schedule"):
        TrainSettings(lr_schedule="linear")
    with pytest.raises(ConfigError, match="lr_milestones"):
        TrainSettings(lr_schedule="step", lr_milestones=[5, 3])
