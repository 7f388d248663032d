"""The batched-clients engine (training.engine: batched) against the sequential one, and the speed switches.

Invariants: the same random draws (generator states after a round are identical), per-client
results equal up to floating-point rounding, riders (clients with fewer steps) and padded rows
leave no trace, and the stacked layers and optimisers compute exactly what K separate ones do
(checked in float64, where rounding cannot hide a wrong formula).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from fnlcore.errors import ConfigError
from fnlcore.fl.batched import _flatten, _unflatten
from fnlcore.fl.data import ImageSource
from fnlcore.fl.pipeline import InputPipeline
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.stacked import StackedAdam, StackedNet, StackedSGD, stacked_input
from fnlcore.fl.contract import LocalJob, Phase
from fnlcore.fl.simulation import RoundEngine
from fnlcore.methods.base import METHODS
from fnlcore.models import build_model

from .engine_helpers import make_ctx


# -- augmentation: draw, then apply -------------------------------------------------------------------


@pytest.mark.parametrize("aug", ["crop_flip", "affine_flip", "none"])
def test_drawn_parameters_reproduce_train_augmentation_and_generator_state(aug):
    p = InputPipeline(mean=(0.5,) * 3, std=(0.25,) * 3, augmentation=aug)
    x = torch.randint(0, 256, (7, 3, 8, 8), dtype=torch.uint8)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    direct = torch.cat([p.train(x[:4], g1), p.train(x[4:], g1)])
    parts = [p.draw_train(4, g2, x.device), p.draw_train(3, g2, x.device)]  # the engine's sample-wise concatenation
    params = _unflatten(parts[0], [torch.cat(z) for z in zip(*map(_flatten, parts))])
    assert torch.equal(p.apply_train(x, params), direct)
    assert torch.equal(g1.get_state(), g2.get_state())


# -- stacked layers, float64 ----------------------------------------------------------------------------

MODELS = [("mlp", 1, 8), ("cnn", 1, 28), ("lenet5", 1, 28), ("tiny", 3, 16), ("resnet18_cifar", 3, 8), ("resnet18", 3, 32)]


def stacked_and_separate(name: str, channels: int, size: int, k: int = 3, b: int = 4):
    """(template, StackedNet of k perturbed copies, the copies as separate models, input (k*b, ...),
    rows (b, k)): client 1 has a short batch of 3, client 2 rides along with no batch; float64."""
    torch.manual_seed(0)
    template = build_model(name, 5, channels, (size, size)).double().train()
    models = [copy.deepcopy(template) for _ in range(k)]
    with torch.no_grad():
        for m in models:
            for p in m.parameters():
                p.add_(0.05 * torch.randn_like(p))
    net = StackedNet(template, k).double().train()
    for i, m in enumerate(models):
        net.load_client(i, m.state_dict())
    x = torch.randn(k * b, channels, size, size, dtype=torch.float64)
    rows = torch.ones(b, k, dtype=torch.float64)
    rows[3:, 1] = 0  # client 1: a short batch of 3
    rows[:, 2] = 0  # client 2: a rider with no batch
    return template, net, models, x, rows


@pytest.mark.parametrize("name,channels,size", MODELS)
def test_stacked_net_equals_separate_models_with_padded_rows_and_a_rider(name, channels, size):
    template, net, models, x, rows = stacked_and_separate(name, channels, size)
    k, b = 3, 4
    y = torch.randint(0, 5, (k, b))
    logits = net(stacked_input(x, k), rows)
    losses = torch.stack([F.cross_entropy(logits[i, : int(rows[:, i].sum())], y[i, : int(rows[:, i].sum())])
                          for i in range(2)])
    grads = torch.autograd.grad(losses.sum(), net.trainable())
    names = [n for n, _ in net.net.named_parameters()]
    for i, n_rows in ((0, 4), (1, 3)):
        ref_out = models[i](x[i * b : i * b + n_rows])
        assert torch.allclose(logits[i, :n_rows], ref_out, rtol=1e-9, atol=1e-9)
        ref_grads = torch.autograd.grad(F.cross_entropy(ref_out, y[i, :n_rows]), list(models[i].parameters()))
        for n, g, r in zip(names, grads, ref_grads):
            assert torch.allclose(g[i], r, rtol=1e-7, atol=1e-10), n
        ref_state = models[i].state_dict()
        for key, v in net.client_state(i).items():  # BatchNorm running statistics and batch counters
            assert torch.allclose(v.double(), ref_state[key].double(), rtol=1e-9, atol=1e-12), key
    for key, v in net.client_state(2).items():  # the rider: untouched
        assert torch.equal(v, models[2].state_dict()[key]), key


def test_models_with_dropout_are_refused_by_name():
    with pytest.raises(ConfigError, match="Dropout.*engine: sequential"):
        StackedNet(build_model("vgg16", 10, 3, (32, 32)), 2)


# -- stacked optimisers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("per_client", [False, True])  # one rate, or a rate per client (Stage.epoch_lr)
def test_stacked_optimisers_equal_torch_optimisers_per_client_with_a_skipped_step(kind, per_client):
    torch.manual_seed(1)
    k = 3
    stacked = torch.randn(k, 4, 2, dtype=torch.float64)
    grads = [torch.randn(k, 4, 2, dtype=torch.float64) for _ in range(3)]
    active = [None, torch.tensor([True, False, True]), None]  # client 1 has no step 2
    base = 0.1 if kind == "sgd" else 0.01
    rates = [base * f for f in ((1.0, 0.5, 2.0) if per_client else (1.0, 1.0, 1.0))]
    mine = [stacked.clone()]
    opt = (StackedSGD(mine, base, momentum=0.9, weight_decay=1e-2) if kind == "sgd"
           else StackedAdam(mine, base, (0.9, 0.99), weight_decay=1e-2))
    if per_client:
        opt.lr = torch.tensor(rates, dtype=torch.float64)
    for g, a in zip(grads, active):
        opt.step([g], a)
    for i in range(k):
        p = torch.nn.Parameter(stacked[i].clone())
        ref = (torch.optim.SGD([p], lr=rates[i], momentum=0.9, weight_decay=1e-2) if kind == "sgd"
               else torch.optim.Adam([p], lr=rates[i], betas=(0.9, 0.99), weight_decay=1e-2))
        for g, a in zip(grads, active):
            if a is not None and not a[i]:
                continue
            p.grad = g[i].clone()
            ref.step()
        assert torch.allclose(mine[0][i], p.detach(), rtol=1e-12, atol=1e-14)


# -- the engine, end to end -----------------------------------------------------------------------------


def _run(method: str, engine: str, params: dict | None = None, multi_label: bool = False, **settings):
    base = dict(rounds=3, local_epochs=2, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4,
                augmentation="crop_flip", model="mlp")
    s = TrainSettings(**{**base, **settings, "engine": engine})
    ctx = make_ctx(s, seed=3, num_clients=3, n_train=400, multi_label=multi_label)  # clients of 134, 133, 133
    cls = METHODS[method]
    m = cls(cls.Params(**(params or {})), ctx)
    metrics = Simulation(m, ctx, progress=lambda s: None).run()
    return metrics, m, ctx


def _assert_same_run(a, b, atol):
    (ma, mod_a, ca), (mb, mod_b, cb) = a, b
    assert torch.equal(ca.shuffle_gen.get_state(), cb.shuffle_gen.get_state())  # the very same draws
    assert torch.equal(ca.aug_gen.get_state(), cb.aug_gen.get_state())
    assert torch.equal(ca.data.given, cb.data.given)
    sa, sb = mod_a.global_model.state_dict(), mod_b.global_model.state_dict()
    for key in sa:
        assert torch.allclose(sa[key].double(), sb[key].double(), rtol=1e-4, atol=atol), key
    score = "bacc" if "bacc" in ma else "acc"
    assert ma[score].tolist() == pytest.approx(mb[score].tolist(), abs=0.01)


# Every registered method at its defaults, on every label kind it trains on, is checked batched
# against sequential by the registry-wide contract (tests/test_batched_contract.py: decisions equal,
# floats within a stated tolerance, every batched stage entered). The cases here cover what that run
# does not take: training settings (augmentation draws, weight decay, Adam, drop_last, a conv model,
# client sampling with chunks of one client) and hyper-parameters that switch a batched loss to
# another branch.
@pytest.mark.parametrize(
    "method,params,settings",
    [
        ("fedavg", None, {}),  # crop_flip draws, weight decay, clients of 134/133/133 (padded last batches)
        ("fedavg", None, {"optimizer": "adam", "lr": 3e-3, "augmentation": "affine_flip", "drop_last": True}),
        ("fedavg", None, {"model": "tiny", "client_fraction": 0.67, "batched_clients": 1}),
        ("fedprox", {"mu": 0.5, "form": "fedcorr_unsquared", "skip_first_batch": True}, {"drop_last": True}),
        ("rhfl", {"local_loss": "ce"}, {}),
        ("fednoro_detection", {"gmm_seeds": 2, "logit_adjust": True}, {}),
        ("fedlsr", {"cls_on_probs": False, "entropy_on": "logits"}, {"augmentation": "affine_flip"}),
    ],
)
def test_batched_engine_reproduces_the_sequential_engine_under_other_settings(method, params, settings):
    _assert_same_run(_run(method, "sequential", params, **settings), _run(method, "batched", params, **settings), 1e-6)


def test_a_job_of_phases_on_distinct_networks_batches_each_phase_and_a_shared_network_is_refused(monkeypatch):
    """DivideMix's warm-up (net1's epochs, then net2's) trains batched phase after phase; a job whose
    two phases train the same network (the second would start from the first's result) is refused."""
    from fnlcore.fl import batched

    calls = []
    train_clients = batched.train_clients
    monkeypatch.setattr(batched, "train_clients",
                        lambda ctx, *a, **k: calls.append(k["phase"].train) or train_clients(ctx, *a, **k))
    params = {"warmup_rounds": 2}
    _assert_same_run(_run("dividemix", "sequential", params, rounds=3),
                     _run("dividemix", "batched", params, rounds=3), 1e-6)
    assert calls == [("net1",), ("net2",)] * 2  # the two warm-up rounds; round 2 co-divides sequentially
    cls = METHODS["dividemix"]
    twice = lambda self, r, k, nets: LocalJob(phases=[Phase(train=("net1",)), Phase(train=("net1",))])  # noqa: E731
    monkeypatch.setattr(cls, "stages", {**cls.stages, "warmup": dataclasses.replace(cls.stages["warmup"], prepare=twice)})
    with pytest.raises(ConfigError, match=r"two phases of its job train \['net1'\]"):
        _run("dividemix", "batched", params, rounds=3)


def test_a_round_runs_batched_only_where_its_stage_batches(monkeypatch):
    """FedNoRo's stage table with stage 2 marked ``batches=False``: warm-up rounds batched, stage 2 sequential."""
    from fnlcore.fl import batched, sequential

    cls = METHODS["fednoro"]
    st = cls.stages["stage2"]
    monkeypatch.setattr(cls, "stages", {**cls.stages, "stage2": dataclasses.replace(st, batches=False)})
    calls = {"batched": [], "sequential": []}
    train_clients, train_client = batched.train_clients, sequential.train_client
    monkeypatch.setattr(batched, "train_clients", lambda ctx, *a, **k: calls["batched"].append(1) or train_clients(ctx, *a, **k))
    monkeypatch.setattr("fnlcore.fl.simulation.train_client",
                        lambda m, r, k: calls["sequential"].append(r) or train_client(m, r, k))
    _run("fednoro", "batched", {"warmup_rounds": 2, "detection_votes": 1}, rounds=4, local_epochs=1)
    assert len(calls["batched"]) == 2 and sorted(set(calls["sequential"])) == [2, 3]


def test_batched_engine_with_batchnorm_matches_one_local_step():
    # ResNet-18 on 8x8 digits (BatchNorm on 1x1 maps in its last stage) amplifies float32 rounding step
    # after step: even the sequential engine with channels-last memory ends a round ~0.1 away from
    # itself. One step per client (batch 134: clients of 134 and 133 samples, so a padded row)
    # isolates the engine's plumbing and BatchNorm statistics (measured: batched vs sequential 1.4e-5,
    # sequential vs sequential channels-last 2.8e-5); the exact check is the float64 one above.
    kw = dict(model="resnet18_cifar", rounds=1, local_epochs=1, batch_size=134, lr=0.01, augmentation="crop_flip")
    _assert_same_run(_run("fedavg", "sequential", **kw), _run("fedavg", "batched", **kw), 1e-4)


def test_trainable_client_copies_equal_separate_models_with_batchnorm_a_padded_row_and_a_rider():
    """A client copy in train mode that a method trains by hand (FedFixer's θ): forward with a gradient
    (BatchNorm on real rows only), gradients by name and a step that a rider does not take, in float64
    against each client's own model (OneCopy: the same ops on the plain model)."""
    from fnlcore.fl.copies import OneCopy, StackedCopies

    template, net, models, x, rows = stacked_and_separate("resnet18_cifar", 3, 8)
    k, b = 3, 4
    mask = rows.t().bool()  # (K, B): client 1 a short batch of 3, client 2 a rider
    copies = StackedCopies(net, net)
    y = torch.randint(0, 5, (k, b))
    out = copies.forward(x, mask)
    losses = torch.stack([F.cross_entropy(out[i, : int(mask[i].sum())], y[i, : int(mask[i].sum())]) for i in range(2)])
    grads = copies.grads(losses.sum())
    stepped = mask[:, 0]
    copies.assign_({n: p - 0.1 * grads[n] for n, p in copies.parameters().items()}, stepped)
    for i, n_rows in ((0, 4), (1, 3)):
        one = OneCopy(models[i], models[i])
        ref = one.forward(x[i * b : i * b + n_rows])[0]
        assert torch.allclose(out[i, :n_rows], ref, rtol=1e-9, atol=1e-9)
        ref_grads = one.grads(F.cross_entropy(ref, y[i, :n_rows]))
        one.assign_({n: p - 0.1 * ref_grads[n] for n, p in one.parameters().items()}, None)
        for key, v in net.client_state(i).items():  # parameters after the step, BatchNorm statistics
            assert torch.allclose(v.double(), models[i].state_dict()[key].double(), rtol=1e-7, atol=1e-10), key
    for key, v in net.client_state(2).items():  # the rider: untouched
        assert torch.equal(v, models[2].state_dict()[key]), key


def test_clients_at_different_local_epochs_step_at_their_own_epoch_rate(monkeypatch):
    """Clients of 134/133/133 samples in batches of 133: client 0 takes two steps an epoch, the others
    one, so at step 1 client 0 is in epoch 0 and the others in epoch 1. FedFixer's rate is per epoch
    (β ramp: plr / (1 + β_e), β_0 = 0, β_1 = β_max with begin_sel = 1): batched equals sequential only
    if each client steps at its own epoch's rate (and its loss uses its own epoch's β)."""
    from fnlcore.fl import batched

    mixed = []
    rates = batched._epoch_rates
    monkeypatch.setattr(batched, "_epoch_rates", lambda *a: mixed.append(isinstance(r := rates(*a), torch.Tensor)) or r)
    params = {"begin_sel": 1, "inner_steps": 1}
    kw = dict(rounds=2, batch_size=133)
    seq, bat = _run("fedfixer", "sequential", params, **kw), _run("fedfixer", "batched", params, **kw)
    _assert_same_run(seq, bat, 1e-6)
    assert any(mixed) and not all(mixed)  # some steps mix epochs, others do not
    tl = batched.build_timeline(bat[2], [torch.arange(134), torch.arange(133)], 2, 133)
    assert tl.epoch.tolist() == [[0, 0], [0, 1], [1, 1], [1, 1]]  # client 1 rides along in its last epoch


def test_batched_engine_resumes_exactly_after_a_kill(tmp_path):
    s = TrainSettings(rounds=4, local_epochs=1, batch_size=16, lr=0.05, momentum=0.9, checkpoint_every=2,
                      engine="batched", model="mlp")
    full = Simulation(METHODS["fedavg"](METHODS["fedavg"].Params(), ctx := make_ctx(s, seed=2)), ctx,
                      progress=lambda m: None).run()
    ckpt = tmp_path / "ckpt.pt"
    ctx1 = make_ctx(s, seed=2)
    Simulation(METHODS["fedavg"](METHODS["fedavg"].Params(), ctx1), ctx1, ckpt, lambda m: None, stop_after=2).run()
    ctx2 = make_ctx(s, seed=2)
    resumed = Simulation(METHODS["fedavg"](METHODS["fedavg"].Params(), ctx2), ctx2, ckpt, lambda m: None).run()
    assert resumed["acc"].tolist() == full["acc"].tolist()


def test_engine_switch_errors_name_the_cause_and_the_fix(monkeypatch):
    # every method batches some stage now: FedAvg's table with its one stage marked batches=False stands
    # for a method that batches none
    cls = METHODS["fedavg"]
    monkeypatch.setattr(cls, "stages", {"main": dataclasses.replace(cls.stages["main"], batches=False)})
    with pytest.raises(ConfigError, match="engine: batched cannot run method 'fedavg'.*engine: auto"):
        _run("fedavg", "batched")
    _, m, _ = _run("fedavg", "auto", rounds=1)  # auto: sequential for it
    assert RoundEngine(m).batched is False
    monkeypatch.undo()
    _, m, _ = _run("fedavg", "auto", rounds=1)
    assert RoundEngine(m).batched is True
    _, m, _ = _run("fedavg", "auto", rounds=1, model="resnet18_cifar", batch_size=134)
    assert RoundEngine(m).batched is False  # auto on a CPU: BatchNorm models stay sequential (measured slower batched)
    with pytest.raises(ConfigError, match="training.engine='turbo'"):
        TrainSettings(engine="turbo")
    with pytest.raises(ConfigError, match="training.precision='fp16'"):
        TrainSettings(precision="fp16")


def test_batched_engine_refuses_file_streamed_images(tmp_path):
    s = TrainSettings(rounds=1, engine="batched", model="mlp")
    ctx = make_ctx(s)
    ctx.data.train = ImageSource(ctx.device, paths=["x.png"] * len(ctx.data.train), image_size=(8, 8), channels=1)
    with pytest.raises(ConfigError, match="in memory.*engine: auto or sequential"):
        Simulation(METHODS["fedavg"](METHODS["fedavg"].Params(), ctx), ctx, progress=lambda m: None)


# -- precision and memory format switches -------------------------------------------------------------


def test_bf16_autocast_trains_in_bf16_and_keeps_fp32_parameters():
    fp32, m32, _ = _run("fedavg", "sequential", rounds=2, model="tiny")
    bf16, m16, ctx = _run("fedavg", "sequential", rounds=2, model="tiny", precision="bf16")
    assert all(p.dtype == torch.float32 for p in m16.global_model.parameters())
    with ctx.autocast():
        assert m16.global_model(torch.zeros(2, 1, 8, 8)).dtype == torch.bfloat16
    assert bf16["acc"].notna().all()
    a, b = m32.global_model.state_dict(), m16.global_model.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)  # bf16 changes the arithmetic ...
    assert all(torch.allclose(a[k], b[k], atol=0.05) for k in a)  # ... not the result beyond its precision


def test_channels_last_switch_changes_memory_format_not_results():
    kw = dict(model="resnet18_cifar", rounds=1, local_epochs=1, batch_size=134, lr=0.01, augmentation="none")
    _, m0, _ = _run("fedavg", "sequential", **kw)
    _, m1, ctx = _run("fedavg", "sequential", channels_last=True, **kw)
    conv = m1.global_model.backbone.blocks[0].conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert ctx.pipeline.eval(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)).is_contiguous(memory_format=torch.channels_last)
    a, b = m0.global_model.state_dict(), m1.global_model.state_dict()
    assert all(torch.allclose(a[k].double(), b[k].double(), rtol=1e-4, atol=1e-4) for k in a)


def test_speed_switches_are_part_of_the_run_identity():
    from fnlcore.app.runs import train_slug

    base = TrainSettings()
    slugs = {train_slug(dataclasses.replace(base, **kw)) for kw in
             ({}, {"engine": "batched"}, {"precision": "bf16"}, {"channels_last": True})}
    assert len(slugs) == 4
