"""Engine v2 capabilities, one test (or more) each: views, RandAugment, mixup, epoch hooks,
several networks per client, several batch streams, features, should_evaluate, LR schedules."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps

from fnlcore.errors import ConfigError
from fnlcore.fl.contract import LocalJob, Phase, Stage
from fnlcore.fl.pipeline import InputPipeline
from fnlcore.fl.sequential import train_client, train_epochs, train_streams
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.state import snapshot
from fnlcore.methods.base import FLMethod, MethodParams
from fnlcore.methods.fedavg import FedAvg, FedAvgParams
from fnlcore.models import build_model
from fnlcore.randaugment import (
    GEOMETRIC, KINDS, OP_NAMES, RandAugmentSpec, colour_op, cutout, mix_targets, mixup, op_value, pil_matrix, rand_augment, warp,
)

from .engine_helpers import make_ctx


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _images(n=32, c=3, size=16, seed=0):
    return torch.randint(0, 256, (n, c, size, size), dtype=torch.uint8, generator=_gen(seed))


# -- RandAugment, Cutout, mixup ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_rand_augment_keeps_shape_dtype_and_is_seeded(kind):
    x = _images()
    spec = RandAugmentSpec(kind, n=3, m=10)
    a = rand_augment(x, spec, _gen(1))
    b = rand_augment(x, spec, _gen(1))
    c = rand_augment(x, spec, _gen(2))
    assert a.dtype == torch.uint8 and a.shape == x.shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    f = rand_augment(x.float(), spec, _gen(1))
    assert f.dtype == torch.float32 and torch.equal(f, a.float())  # float in, same values


def test_rand_augment_rejects_bad_parameters_by_name():
    with pytest.raises(ConfigError, match="kind='autoaugment'"):
        RandAugmentSpec("autoaugment")
    with pytest.raises(ConfigError, match="m=11"):
        RandAugmentSpec(m=11)
    with pytest.raises(ConfigError, match="n=0"):
        RandAugmentSpec(n=0)


def _record_slots(monkeypatch):
    import fnlcore.randaugment as ra

    seen = []
    real = ra._apply_slot
    monkeypatch.setattr(ra, "_apply_slot", lambda x, op, lv, sg, ap, k: (seen.append((op, lv, ap)), real(x, op, lv, sg, ap, k))[1])
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_rand_augment_draws_every_op_about_equally_often(monkeypatch, kind):
    seen = _record_slots(monkeypatch)
    rand_augment(_images(n=2800, size=8), RandAugmentSpec(kind, n=2), _gen(0))
    assert len(seen) == 2
    for op, level, apply in seen:
        counts = torch.bincount(op, minlength=len(OP_NAMES)).float()
        assert counts.min() > 0.7 * 200 and counts.max() < 1.3 * 200  # 2800 / 14 = 200 expected
        if kind == "fixmatch_mc":  # level uniform in 1..m-1, each op applied with probability 0.5
            assert set(level.long().tolist()) == set(range(1, 10))
            assert 0.45 < apply.float().mean() < 0.55
        else:
            assert apply.all() and 0 <= level.min() and level.max() < 1


def test_mc_levels_map_to_fixmatch_values():
    lv = torch.arange(1.0, 10.0)
    sign = torch.ones(9)

    def value(name):
        return op_value(name, lv, sign, "fixmatch_mc", (32, 32)).tolist()

    assert value("brightness") == pytest.approx([0.05 + 0.09 * v for v in range(1, 10)])
    assert value("posterize") == [4 + int(v * 4 / 10) for v in range(1, 10)]
    assert value("solarize") == [256 - int(v * 256 / 10) for v in range(1, 10)]
    assert value("rotate") == [int(v * 30 / 10) for v in range(1, 10)]
    assert value("translate_x") == [int(v * 0.3 / 10 * 32) for v in range(1, 10)]
    assert op_value("rotate", lv, -sign, "fixmatch_mc", (32, 32)).tolist() == [-int(v * 3) for v in range(1, 10)]
    u = torch.tensor([0.0, 0.5, 0.999])
    assert op_value("rotate", u, None, "fixmatch_uniform", (32, 32)).tolist() == pytest.approx([-30.0, 0.0, 29.94])
    assert op_value("posterize", u, None, "fixmatch_uniform", (32, 32)).tolist() == [4.0, 6.0, 7.0]


def _pil_images(n=4, c=3, h=17, w=20):
    x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=_gen(5))
    return x, [Image.fromarray(np.ascontiguousarray(x[i].permute(1, 2, 0).squeeze(-1).numpy())) for i in range(n)]


def _from_pil(images):
    return torch.stack([torch.from_numpy(np.asarray(im).copy()).reshape(im.size[1], im.size[0], -1).permute(2, 0, 1) for im in images])


_PIL_COLOUR = {
    "brightness": lambda im, v: ImageEnhance.Brightness(im).enhance(v),
    "color": lambda im, v: ImageEnhance.Color(im).enhance(v),
    "contrast": lambda im, v: ImageEnhance.Contrast(im).enhance(v),
    "sharpness": lambda im, v: ImageEnhance.Sharpness(im).enhance(v),
    "posterize": lambda im, v: ImageOps.posterize(im, int(v)),
    "solarize": lambda im, v: ImageOps.solarize(im, v),
    "autocontrast": lambda im, v: ImageOps.autocontrast(im),
    "equalize": lambda im, v: ImageOps.equalize(im),
}


@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("name", sorted(_PIL_COLOUR))
def test_colour_ops_equal_pil(name, channels):
    x, ims = _pil_images(c=channels)
    for v in {"posterize": (4.0, 6.0, 8.0), "solarize": (0.0, 100.5, 256.0)}.get(name, (0.14, 0.5, 0.95)):
        ours = colour_op(name, x.float(), torch.full((len(ims),), v))
        assert torch.equal(ours, _from_pil([_PIL_COLOUR[name](im, v) for im in ims]).float()), (name, v)


_PIL_GEOMETRIC = {
    "rotate": lambda im, v: im.rotate(v),
    "shear_x": lambda im, v: im.transform(im.size, Image.AFFINE, (1, v, 0, 0, 1, 0)),
    "shear_y": lambda im, v: im.transform(im.size, Image.AFFINE, (1, 0, 0, v, 1, 0)),
    "translate_x": lambda im, v: im.transform(im.size, Image.AFFINE, (1, 0, v, 0, 1, 0)),
    "translate_y": lambda im, v: im.transform(im.size, Image.AFFINE, (1, 0, 0, 0, 1, v)),
}


@pytest.mark.parametrize("name", sorted(_PIL_GEOMETRIC))
def test_geometric_ops_equal_pil(name):
    x, ims = _pil_images()
    for v in {"rotate": (-30.0, 13.0, 90.0, 180.0), "shear_x": (-0.3, 0.17), "shear_y": (-0.3, 0.17)}.get(name, (-5.0, 3.7, 6.0)):
        ours = warp(x.float(), pil_matrix(name, torch.full((len(ims),), v), tuple(x.shape[-2:])))
        assert torch.equal(ours, _from_pil([_PIL_GEOMETRIC[name](im, v) for im in ims]).float()), (name, v)


def test_ops_at_their_neutral_value_are_the_identity_and_warps_are_exact():
    x = _images(n=3, size=8).float()
    one = torch.ones(3)
    for name in ("brightness", "color", "contrast", "sharpness"):
        assert torch.equal(colour_op(name, x, one), x)  # enhance factor 1
    assert torch.equal(colour_op("posterize", x, 8 * one), x) and torch.equal(colour_op("solarize", x, 256 * one), x)
    for name in GEOMETRIC:
        assert torch.equal(warp(x, pil_matrix(name, 0 * one, (8, 8))), x)
    assert torch.equal(warp(x, pil_matrix("rotate", 180 * one, (8, 8))), x.flip(-1).flip(-2))
    shifted = warp(x, pil_matrix("translate_x", 2 * one, (8, 8)))  # output column j reads input column j + 2
    assert torch.equal(shifted[..., :6], x[..., 2:]) and (shifted[..., 6:] == 0).all()


def test_cutout_fills_pils_inclusive_rectangle():
    x = torch.zeros(400, 3, 32, 32)
    out = cutout(x, torch.full((400,), 16.0), (125.0, 123.0, 114.0), _gen(0))
    box = out[:, 0] == 125
    rows, cols = box.any(2), box.any(1)
    h, w = rows.sum(1), cols.sum(1)
    interior = (h == 17) & (w == 17)  # x0..x0+16 inclusive, like PIL's rectangle
    assert interior.float().mean() > 0.4 and ((h <= 17) & (w <= 17) & (h >= 8) & (w >= 8)).all()
    assert (box.sum((1, 2)) == h * w).all()  # one solid rectangle
    starts_at_zero = cols[:, 0] & (w == 17)  # a centre near the left edge moves the box, not clips it
    assert starts_at_zero.any()
    assert torch.equal(out[:, 2][box], torch.full_like(out[:, 2][box], 114.0))
    assert torch.equal(cutout(x[:4], torch.zeros(4), (127.0,), _gen(0)), x[:4])  # side 0: unchanged


def test_mixup_mixes_pairs_with_one_seeded_lambda():
    x = torch.randn(8, 3, 4, 4)
    y = torch.arange(8)
    xm, ya, yb, lam = mixup(x, y, 1.0, _gen(3))
    xm2, _, yb2, lam2 = mixup(x, y, 1.0, _gen(3))
    assert lam == lam2 and torch.equal(yb, yb2) and 0 < lam < 1
    assert torch.allclose(xm, lam * x + (1 - lam) * x[yb])  # y = arange: yb is the permutation
    with pytest.raises(ConfigError):
        mixup(x, y, 0.0)
    lams = [mixup(x, y, 4.0, _gen(s), keep_major=True)[3] for s in range(50)]
    assert min(lams) >= 0.5
    soft = F.one_hot(y, 8).float()
    _, sa, sb, lam = mixup(x, soft, 4.0, _gen(1))
    mixed = mix_targets(sa, sb, lam)
    assert torch.allclose(mixed.sum(1), torch.ones(8)) and torch.allclose(mixed.max(1).values, torch.full((8,), max(lam, 1 - lam)))


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


def test_epoch_hook_may_replace_the_streams_each_epoch():
    ctx = make_ctx(TrainSettings(rounds=1, local_epochs=3, batch_size=16))
    idx = ctx.data.clients[0]
    splits = {0: (idx[:40], idx[40:]), 1: (idx[:10], idx[10:]), 2: (idx[:0], idx)}
    seen = {}
    epoch_of_step = []

    def hook(epoch):
        epoch_of_step.append(epoch)
        lab, unl = splits[epoch]
        return {"labelled": (lab, 8), "unlabelled": (unl, 4)}

    def loss(m, batches, step):
        e = epoch_of_step[-1]
        seen.setdefault(e, []).append({n: b[1] for n, b in batches.items()})
        x = torch.cat([b[0] for b in batches.values()])
        return m(ctx.pipeline.eval(x)).sum() * 0.0

    train_streams(ctx, ctx.new_model(), {"labelled": (idx, 8), "unlabelled": (idx[:0], 4)}, loss, 0, on_epoch_start=hook)
    assert len(seen[0]) == 5 and len(seen[1]) == 2 and 2 not in seen  # epoch 2: empty labelled set, no steps
    for e in (0, 1):
        lab, unl = splits[e]
        assert all(set(b["labelled"].tolist()) <= set(lab.tolist()) for b in seen[e])
        assert all(set(b["unlabelled"].tolist()) <= set(unl.tolist()) and len(b["unlabelled"]) == 4 for b in seen[e])
    with pytest.raises(ConfigError, match="stream 'u'"):
        train_streams(ctx, ctx.new_model(), {"l": (idx, 8), "u": (idx, 0)}, loss, 0)


def test_optimizer_factory_takes_an_explicit_rate():
    ctx = make_ctx(TrainSettings(rounds=10, lr=0.1, lr_decay=0.5, momentum=0.9))
    params = list(ctx.new_model().parameters())
    assert ctx.optimizer(params, 2).param_groups[0]["lr"] == pytest.approx(0.025)
    opt = ctx.optimizer(params, 2, lr=0.007)
    assert opt.param_groups[0]["lr"] == 0.007 and opt.param_groups[0]["momentum"] == 0.9


def test_strong_view_can_pad_its_crop_by_reflection():
    from fnlcore import augment

    x = _images(n=64, size=8)
    crop = augment.random_crop(x, 4, _gen(0), "reflect")
    padded = F.pad(x, (4, 4, 4, 4), mode="reflect")
    windows = padded.unfold(2, 8, 1).unfold(3, 8, 1)  # every 8x8 window
    assert all(any(torch.equal(crop[i], windows[i, :, a, b]) for a in range(9) for b in range(9)) for i in range(64))
    assert not torch.equal(crop, augment.random_crop(x, 4, _gen(0)))  # zero padding differs at the borders
    x = _images(n=64, size=32)  # larger than the 16 px Cutout
    p = InputPipeline(mean=(0.5,) * 3, std=(0.5,) * 3, augmentation="crop_flip", strong_padding="reflect")
    q = InputPipeline(mean=(0.5,) * 3, std=(0.5,) * 3, augmentation="crop_flip")
    assert not torch.equal(p.view("strong", x, _gen(3)), q.view("strong", x, _gen(3)))
    assert torch.equal(p.view("weak", x, _gen(3)), q.view("weak", x, _gen(3)))  # the weak view keeps zeros
    with pytest.raises(ConfigError, match="strong_padding='edge'"):
        InputPipeline(mean=(0.5,), std=(0.5,), strong_padding="edge")


# -- several networks per client -----------------------------------------------------------


@dataclass(frozen=True)
class _TwoNetParams(MethodParams):
    name = "test_two_nets"


class _TwoNets(FLMethod):
    """Two global networks, each trained in its own phase at its own rate ('b' never moves)."""

    Params = _TwoNetParams
    networks = ("a", "b")

    def prepare(self, r, k, nets):
        return LocalJob(phases=[Phase(train=("a",)), Phase(train=("b",))], lr={"a": 0.01, "b": 0.0})

    stages = {"main": Stage(loss=FLMethod.loss, prepare=prepare)}


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
    ups = [train_client(m, 0, k) for k in range(2)]
    m.aggregate(0, iter(ups))
    w = np.array([u.num_samples for u in ups], dtype=float)
    w /= w.sum()
    for name in ("a", "b"):
        for key, v in m.globals[name].state_dict().items():
            if v.is_floating_point():
                expect = sum(wi * u.states[name][key].double() for wi, u in zip(w, ups))
                assert torch.allclose(v.double(), expect, atol=1e-6)


class _TwoNetsHooked(_TwoNets):
    def prepare(self, r, k, nets):
        def hook(name):
            return lambda epoch: self.calls.append((r, k, epoch, name))

        return LocalJob(phases=[Phase(train=(n,), on_epoch=hook(n)) for n in ("a", "b")])

    stages = {"main": Stage(loss=FLMethod.loss, prepare=prepare)}


def test_multi_network_runs_the_epoch_hook_for_each_network():
    ctx = make_ctx(TrainSettings(rounds=1, local_epochs=2, batch_size=32))
    m = _TwoNetsHooked(_TwoNetParams(), ctx)
    m.calls = []
    m.begin_round(0)
    train_client(m, 0, 1)
    assert m.calls == [(0, 1, 0, "a"), (0, 1, 1, "a"), (0, 1, 0, "b"), (0, 1, 1, "b")]


def test_a_loss_without_a_stage_table_is_refused_at_class_definition():
    with pytest.raises(TypeError, match="stage table"):
        class _Forgot(FLMethod):  # noqa: F841
            def loss(self, b):
                return b.model(b.x).sum()


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
    k = TrainSettings(rounds=10, lr=0.1, lr_schedule="constant")
    assert {k.lr_at(r) for r in range(10)} == {0.1}
    with pytest.raises(ConfigError, match="lr_decay.*'exponential' only"):
        TrainSettings(lr_schedule="cosine", lr_decay=0.99)
    with pytest.raises(ConfigError, match="lr_milestones.*'step' only"):
        TrainSettings(lr_schedule="constant", lr_milestones=[3])


@dataclass(frozen=True)
class _CoDivideParams(MethodParams):
    name = "test_co_divide"


class _CoDivide(FLMethod):
    """Uses every v2 capability that draws random numbers: per-epoch splits by the peer's losses,
    two streams, weak/strong views with RandAugment, mixup; skips evaluation on even rounds."""

    Params = _CoDivideParams
    networks = ("net1", "net2")

    def two_stream_loss(self, b):  # a phase loss over one client's Batch (several streams)
        ctx = self.ctx
        xl, il = b.streams["labelled"]
        v = ctx.pipeline.views(xl, ctx.aug_gen, ("weak", "strong"))
        xm, ya, yb, lam = mixup(v["strong"], self.labels(il), 1.0, ctx.aug_gen)
        logits = b.model(xm)
        total = lam * F.cross_entropy(logits, ya) + (1 - lam) * F.cross_entropy(logits, yb)
        if "unlabelled" in b.streams:
            total = total + 0.1 * b.model(ctx.pipeline.view("weak", b.streams["unlabelled"][0], ctx.aug_gen)).softmax(1).var()
        return total

    def prepare(self, r, k, nets):
        from fnlcore.fl.local import predict

        ctx, idx = self.ctx, self.ctx.data.clients[k]

        def split(peer):
            def on_epoch(epoch):
                loss = F.cross_entropy(predict(ctx, nets[peer], ctx.data.train, idx), ctx.data.given[idx], reduction="none")
                clean = loss <= loss.median()
                return {"labelled": (idx[clean], 16), "unlabelled": (idx[~clean], 8)}
            return on_epoch

        streams = {"labelled": (idx, 16), "unlabelled": (idx[:0], 8)}
        return LocalJob(phases=[Phase(loss=self.two_stream_loss, train=(n,), streams=streams, augment="raw",
                                      on_epoch=split(peer))
                                for n, peer in (("net1", "net2"), ("net2", "net1"))],
                        lr={"net1": 0.01, "net2": 0.02})

    stages = {"main": Stage(prepare=prepare)}  # several streams: each phase brings its one-client loss

    def should_evaluate(self, r):
        return r % 2 == 1


def _co_divide_run(tmp_path, **kw):
    ctx = make_ctx(TrainSettings(rounds=4, local_epochs=2, batch_size=16, checkpoint_every=1, client_fraction=0.5))
    m = _CoDivide(_CoDivideParams(), ctx)
    return m, Simulation(m, ctx, tmp_path / "ck.pt", progress=lambda s: None, **kw)


def test_a_method_using_every_v2_capability_resumes_exactly(tmp_path):
    import pandas as pd

    full_m, full = _co_divide_run(tmp_path / "full")
    expect = full.run().drop(columns="seconds")
    _, first = _co_divide_run(tmp_path / "killed", stop_after=2)
    first.run()
    m, resumed = _co_divide_run(tmp_path / "killed")
    got = resumed.run().drop(columns="seconds")
    pd.testing.assert_frame_equal(got, expect)
    assert got["acc"].isna().tolist() == [True, False, True, False]
    for name in ("net1", "net2"):
        for key, v in full_m.globals[name].state_dict().items():
            assert torch.equal(v, m.globals[name].state_dict()[key]), (name, key)
    assert not torch.equal(m.globals["net1"].state_dict()["head.weight"], m.globals["net2"].state_dict()["head.weight"])
