"""FedGR (fedgr.md §1): the pure parts on hand-computed cases, the views, then short runs and variants."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.contract import ClientUpdate
from fnlcore.fl.copies import OneCopy
from fnlcore.fl.pipeline import InputPipeline
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.state import snapshot
from fnlcore.methods import METHODS
from fnlcore.methods.fedgr import (
    FedGRParams,
    distill_kl_rows,
    fixmatch_labels,
    refine_reliable,
    refined_terms,
    revision_decay,
    running_mean_update,
    sieve,
)

from .engine_helpers import make_ctx

B = torch.tensor
LOG4, LOG43 = math.log(4.0), math.log(4.0 / 3.0)


def _method(params: FedGRParams | None = None, settings: TrainSettings | None = None, crop: bool = False, **kw):
    ctx = make_ctx(settings, seed=0, **kw)
    if crop:  # the digits context has no training augmentation; give it CIFAR's weak one
        ctx.pipeline = InputPipeline(mean=(0.5,), std=(0.25,), augmentation="crop_flip")
    return METHODS["fedgr"](params or FedGRParams(warmup_rounds=1), ctx), ctx


# -- pure parts ----------------------------------------------------------------------------------


def test_running_mean_of_loss_observations():
    mean, count = running_mean_update(B([0.0, 2.0], dtype=torch.float64), B([0, 1]), B([3.0, 4.0]))
    assert mean.tolist() == [3.0, 3.0] and count.tolist() == [1, 2]
    mean, count = running_mean_update(mean, count, B([0.0, 6.0]))
    assert mean.tolist() == [1.5, 4.0] and count.tolist() == [2, 3]


def test_fixmatch_threshold_is_strict():
    # softmax([3, 0]) = 0.9526, softmax([0, 2]) = 0.8808, softmax([0, 2.2]) = 0.9002
    logits = B([[3.0, 0.0], [0.0, 2.0], [0.0, 2.2], [0.0, 0.0]])
    assert fixmatch_labels(logits, 0.9).tolist() == [0, -1, 1, -1]
    assert fixmatch_labels(B([[0.0, 0.0]]), 0.5).tolist() == [-1]  # exactly 0.5 is not > 0.5


def test_sieve_flags_the_high_loss_mode_whatever_the_component_order():
    proxies = np.r_[np.full(50, 2.0), np.full(50, 0.01)]
    q, clean = sieve(proxies, 0.5, 50, 1e-2, 5e-4, seed=0)
    assert clean.tolist() == [False] * 50 + [True] * 50
    np.testing.assert_allclose(q, np.r_[np.zeros(50), np.ones(50)], atol=1e-6)


def test_sieve_degenerate_proxies_are_all_clean():
    q, clean = sieve(np.full(7, 0.3), 0.5, 50, 1e-2, 5e-4, seed=0)
    assert q.tolist() == [1.0] * 7 and clean.all()
    q, clean = sieve(np.array([4.0]), 0.5, 50, 1e-2, 5e-4, seed=0)
    assert q.tolist() == [1.0] and clean.all()


def test_refine_reliable_by_hand():
    # clean → ŷ; noisy with a pseudo-label → it; noisy without → older entry kept (or none)
    noisy = B([False, True, True, True])
    labels, has = refine_reliable(noisy, B([1, 2, 3, 4]), B([5, 6, -1, -1]), B([0, 0, 7, 0]), B([False, False, True, False]))
    assert labels.tolist() == [1, 6, 7, 0] and has.tolist() == [True, True, True, False]


def test_refined_terms_by_hand():
    # p = softmax([0, log 3]) = [0.25, 0.75]: CE(y=0) = log 4, CE(y=1) = log 4/3
    logits = torch.log(B([[1.0, 3.0], [1.0, 3.0]]))
    given, reliable = B([0, 0]), B([1, 1])
    has, q = B([True, False]), B([0.25, 0.5])
    # a: 0.25 log 4 + 0.75 log 4/3; b: 0.5 log 4 + 0 (no entry)
    low, high = B([False, False]), B([True, True])
    got = refined_terms(logits, given, reliable, has, q, low)
    assert got.tolist() == pytest.approx([0.25 * LOG4 + 0.75 * LOG43, 0.5 * LOG4], rel=1e-6)
    assert refined_terms(logits, given, reliable, has, q, high).tolist() == pytest.approx([LOG43, 0.0], rel=1e-6)
    # per sample: each row takes its own client's rule
    mixed = refined_terms(logits, given, reliable, has, q, B([True, False]))
    assert mixed.tolist() == pytest.approx([LOG43, 0.5 * LOG4], rel=1e-6)
    # a clean-flagged sample (Y* = ŷ) gets CE(ŷ) whatever q
    got = refined_terms(logits[:1], B([1]), B([1]), B([True]), B([0.3]), B([False]))
    assert float(got) == pytest.approx(LOG43, rel=1e-6)


def test_without_label_refining_the_loss_is_ce_on_clean_flagged_samples_only():
    # Table 4 'w/o LR': CE(p, ŷ)·1[clean-flagged], whatever q, Y* or r_k ≥ β
    m, ctx = _method(FedGRParams(warmup_rounds=1, label_refining=False))
    idx = ctx.data.clients[0][:2]
    m.noisy_labels[idx] = B([0, 0])
    m.noisy_flag[idx] = B([False, True])
    logits = torch.log(B([[1.0, 3.0] + [1e-9] * 8, [1.0, 3.0] + [1e-9] * 8]))
    for high in (B([False, False]), B([True, True])):
        got = m._supervised_terms(logits, idx, high)
        assert got.tolist() == pytest.approx([LOG4, 0.0], rel=1e-6)


def test_distillation_kl_by_hand():
    uniform = torch.zeros(1, 2)
    target = torch.log(B([[3.0, 1.0]]))
    # τ = 1: KL([0.75, 0.25] ‖ [0.5, 0.5]) = 0.75 log 1.5 + 0.25 log 0.5
    assert float(distill_kl_rows(uniform, target, 1.0)) == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5),
                                                                         rel=1e-5)
    # τ = 0.5 sharpens the target to [0.9, 0.1]
    assert float(distill_kl_rows(uniform, target, 0.5)) == pytest.approx(0.9 * math.log(1.8) + 0.1 * math.log(0.2),
                                                                         rel=1e-5)
    assert float(distill_kl_rows(target, target, 0.5)) == pytest.approx(0.0, abs=1e-7)


def test_revision_decay_rule():
    args = dict(beta=0.8, mu=0.5, gamma_g=0.9)
    assert revision_decay(4, 5, 0.0, 1.0, **args) == 0.0  # warm-up: replaced by the global model
    assert revision_decay(5, 5, 0.0, 0.0, **args) == 0.9
    assert revision_decay(5, 5, 0.8, 0.4, **args) == 0.0  # r_k ≥ β and |D^r|/n < μ
    assert revision_decay(5, 5, 0.8, 0.4, strict=True, **args) == 0.9  # dev: r_k > β
    assert revision_decay(5, 5, 0.9, 0.6, **args) == 0.9  # enough reliable labels
    assert revision_decay(5, 5, 0.9, 0.4, strict=True, **args) == 0.0


def test_ema_revision_and_per_step_tracker():
    ema, glob = torch.nn.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    with torch.no_grad():
        ema.weight.copy_(B([1.0, 3.0]))
        glob.weight.copy_(B([3.0, 5.0]))
        glob.num_batches_tracked.fill_(7)
    OneCopy(ema, glob).lerp_(1.0 - 0.5, None)  # revise_ema's blend: lerp by 1 - γ_g, integer counters copied
    assert ema.weight.tolist() == [2.0, 4.0] and int(ema.num_batches_tracked) == 7
    OneCopy(ema, glob).lerp_(1.0 - 0.9, None)
    np.testing.assert_allclose(ema.weight.tolist(), [2.1, 4.1], rtol=1e-6)
    teacher, student = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    torch.nn.init.zeros_(teacher.weight), torch.nn.init.zeros_(teacher.bias)
    torch.nn.init.ones_(student.weight), torch.nn.init.ones_(student.bias)
    step = OneCopy(teacher, student)  # the engine's copy of FedGR's after_step: lerp by 1 - γ_l
    step.lerp_(1.0 - 0.99, B([True]))
    np.testing.assert_allclose(teacher.weight.detach().numpy(), [[0.01, 0.01]], rtol=1e-5)
    step.lerp_(1.0 - 0.99, B([True]))  # 0.99 * 0.01 + 0.01
    np.testing.assert_allclose(teacher.bias.detach().numpy(), [0.0199], rtol=1e-5)


# -- views ---------------------------------------------------------------------------------------


def test_views_are_deterministic_under_a_seed_and_stay_on_the_device():
    m, ctx = _method(crop=True)
    assert m.pipeline.strong.kind == "fixmatch_uniform" and m.pipeline.strong.n == 3
    assert m.pipeline.strong_padding == "reflect"
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for dev in devices:
        x = ctx.data.train.images[:16].to(dev)
        outs = []
        for seed in (3, 3, 4):
            ctx.aug_gen = torch.Generator(device=dev).manual_seed(seed)
            outs.append(m.pipeline.views(x, ctx.aug_gen, ("weak", "strong")))
        for v in ("weak", "strong"):
            assert outs[0][v].device.type == dev.type and outs[0][v].dtype == torch.float32
            assert torch.equal(outs[0][v], outs[1][v])
            assert not torch.equal(outs[0][v], outs[2][v])
        assert not torch.equal(outs[0]["weak"], outs[0]["strong"])


def _student_views(m, views: dict) -> tuple:
    """(weak view, the view the student forwards) of ``m._student`` on a stand-in step with ``views``."""
    seen = []

    def forward_features(v):
        seen.append(v)
        return torch.zeros(1, len(v), 10), torch.zeros(1, len(v), 4)

    sb = SimpleNamespace(views=views, idx=torch.zeros(1, 8, dtype=torch.int64), forward_features=forward_features)
    return m._student(sb)[0], seen[0]


def test_augmentation_ablations():
    m, ctx = _method(FedGRParams(warmup_rounds=1, weak_aug=False, strong_aug=False), crop=True)
    x, idx = ctx.data.train.images[:8], ctx.data.clients[0]
    assert m._step_views("main") == ("eval",)  # the un-augmented image, which the student sees too
    views = {"eval": m.pipeline.eval(x)}
    weak, student = _student_views(m, views)
    assert weak is views["eval"] and student is weak
    passes = m._pass(m.global_model, idx, ("weak",))["weak"], m._pass(m.global_model, idx, ("eval",))["eval"]
    assert torch.equal(*passes)  # the pre-training pass's weak view is the un-augmented image too
    m, ctx = _method(FedGRParams(warmup_rounds=1, strong_aug=False), crop=True)
    assert m._step_views("main") == ("weak",)
    views = m.pipeline.views(x, ctx.aug_gen, ("weak",))
    assert _student_views(m, views)[1] is views["weak"] and not torch.equal(views["weak"], m.pipeline.eval(x))
    m, ctx = _method(crop=True)
    views = m.pipeline.views(x, ctx.aug_gen, ("weak", "strong"))
    weak, student = _student_views(m, views)
    assert weak is views["weak"] and student is views["strong"]


# -- Federated Sieving, Label Refining and the EMA revision inside the method ---------------------------


def test_federated_sieving_pools_the_uploaded_proxies_on_the_server():
    m, ctx = _method()
    m.begin_round(0)
    c0, c1 = ctx.data.clients[0], ctx.data.clients[1]
    state = snapshot(m.global_model)
    m.aggregate(0, [
        ClientUpdate(0, len(c0), {"model": state}, {"proxy": (c0, torch.full((len(c0),), 0.01, dtype=torch.float64))}),
        ClientUpdate(1, len(c1), {"model": state}, {"proxy": (c1, torch.full((len(c1),), 2.0, dtype=torch.float64))}),
    ])
    assert m.noise_ratio(0) == 0.0 and m.noise_ratio(1) == 1.0
    assert m.noise_ratio(2) == 0.0  # never sieved: counts as clean
    assert bool((m.clean_prob[c0] > 0.99).all()) and bool((m.clean_prob[c1] < 0.01).all())
    assert bool((m.clean_prob[ctx.data.clients[2]] == 1.0).all())


def test_label_refining_persists_reliable_labels_as_relabels():
    m, ctx = _method()
    idx = ctx.data.clients[0]
    n = len(idx)
    y, original = m.noisy_labels[idx], m.noisy_labels.clone()
    m.noisy_flag[idx[:5]] = True
    pseudo = torch.full((n,), -1, dtype=torch.int64)
    pseudo[:3] = (y[:3] + 1) % 10
    pseudo[10] = (y[10] + 1) % 10  # clean-flagged: keeps its given label
    assert m.label_refining(1, 0, pseudo) == 3
    assert ctx.data.given[idx[:3]].tolist() == ((y[:3] + 1) % 10).tolist()
    assert torch.equal(ctx.data.given[idx[3:]], y[3:])
    assert m.has_reliable[idx].tolist() == [True] * 3 + [False] * 2 + [True] * (n - 5)
    frame = ctx.data.relabels.frame()
    assert frame["sample"].tolist() == idx[:3].tolist() and set(frame["round"]) == {1} and set(frame["client"]) == {0}
    # sample 0 is now sieved clean: its entry returns to the given label; sample 1 keeps its pseudo-label
    m.noisy_flag[idx[0]] = False
    assert m.label_refining(2, 0, torch.full((n,), -1, dtype=torch.int64)) == 1
    assert int(ctx.data.given[idx[0]]) == int(y[0]) and int(ctx.data.given[idx[1]]) == int((y[1] + 1) % 10)
    assert torch.equal(m.noisy_labels, original)  # ŷ is kept aside, never relabelled


def _fill(model, value):
    with torch.no_grad():
        for v in model.state_dict().values():
            if v.is_floating_point():
                v.fill_(value)


def _float_values(state):
    return torch.cat([v.reshape(-1).float() for v in state.values() if v.is_floating_point()])


def test_ema_revision_by_hand():
    m, _ = _method(FedGRParams(warmup_rounds=1, gamma_g=0.75))
    _fill(m.global_model, 1.0)
    m.ema.put(0, {k: torch.zeros_like(v) for k, v in m.global_model.state_dict().items()})
    assert m.revise_ema(1, 0, noise_ratio=0.0, reliable_frac=1.0) == 0.75
    assert bool((_float_values(m.workers["ema"].state_dict()) == 0.25).all())  # 0.75·0 + 0.25·1
    for r, ratio, frac in ((0, 0.0, 1.0), (1, 0.9, 0.4)):  # warm-up; high noise short of reliable labels
        assert m.revise_ema(r, 0, noise_ratio=ratio, reliable_frac=frac) == 0.0
        assert bool((_float_values(m.workers["ema"].state_dict()) == 1.0).all())
    assert m.revise_ema(1, 3, 0.0, 1.0) == 0.0  # a client without an EMA model yet starts from the global one
    assert bool((_float_values(m.workers["ema"].state_dict()) == 1.0).all())


# -- runs -------------------------------------------------------------------------------------------

RUN = TrainSettings(rounds=4, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3, client_fraction=0.5)


def test_warmup_then_main_phase_end_to_end():
    m, ctx = _method(FedGRParams(warmup_rounds=2, lambda_r=0.1, confidence=0.0), RUN, noisy_clients=(0, 1),
                     n_train=240)
    seen = []
    select = m.select_clients
    m.select_clients = lambda r: seen.append(select(r)) or seen[-1]
    df = Simulation(m, ctx, progress=lambda s: None).run()
    assert df["stage"].tolist() == ["warmup", "warmup", "main", "main"]
    assert sorted(seen[0] + seen[1]) == [0, 1, 2, 3]  # without replacement: every client once in warm-up
    assert np.isfinite(df["acc"]).all() and df["acc"].iloc[-1] > 0.1  # above chance (10 classes)
    assert df["ema_reset_mean"].tolist()[:2] == [1.0, 1.0]
    # ℓ̄: one observation per selection
    counts = torch.zeros(4, dtype=torch.int64)
    for sel in seen:
        counts[sel] += 1
    for k, c in enumerate(ctx.data.clients):
        assert bool((m.loss_count[c] == counts[k]).all())
    assert m.ema.clients() == [0, 1, 2, 3]
    assert bool(m.has_reliable.any()) and len(ctx.data.relabels) > 0  # ε = 0: every sample has a pseudo-label
    changed = ctx.data.given != m.noisy_labels
    assert bool((m.has_reliable[changed]).all())  # only Y* entries differ from ŷ


@pytest.mark.parametrize("change", [
    {"sieving": "local"}, {"label_refining": False}, {"lambda_r": 0.0}, {"lambda_b": 0.0},
    {"weak_aug": False}, {"strong_aug": False}, {"teacher": "online"}, {"warmup_sampling": "uniform"},
    {"high_noise_labels": "pseudo_only", "beta": 0.0}, {"ema_reset_strict": True}, {"freeze_sieving": True},
])
def test_every_switch_runs(change):
    settings = dataclasses.replace(RUN, rounds=3)
    m, ctx = _method(FedGRParams(warmup_rounds=1, confidence=0.3, **change), settings, n_train=160)
    df = Simulation(m, ctx, progress=lambda s: None).run()
    assert len(df) == 3 and np.isfinite(df["acc"]).all()
    if change.get("sieving") == "local":
        assert bool(m.noisy_flag.any())  # partitions came from the clients' own GMMs


def test_warmup_must_leave_a_main_phase():
    with pytest.raises(ConfigError, match="warmup_rounds=100 must be < training.rounds=50"):
        FedGRParams().check_training(TrainSettings(rounds=50))
    p = FedGRParams()
    assert (p.warmup_rounds, p.lambda_b, p.confidence, p.beta, p.mu, p.gamma_g, p.gamma_l, p.tau_b, p.tau_r) == (
        100, 1.0, 0.9, 0.8, 0.5, 0.9, 0.99, 0.5, 0.5)


def test_without_label_refining_no_label_is_written_but_the_reliable_set_is_counted():
    m, ctx = _method(FedGRParams(warmup_rounds=1, label_refining=False))
    idx = ctx.data.clients[0]
    m.noisy_flag[idx[:2]] = True
    pseudo = torch.full((len(idx),), -1, dtype=torch.int64)
    pseudo[0] = (m.noisy_labels[idx[0]] + 1) % 10
    assert m.label_refining(1, 0, pseudo) == 0 and len(ctx.data.relabels) == 0
    assert torch.equal(ctx.data.given, m.noisy_labels)
    assert int(m.has_reliable[idx].sum()) == len(idx) - 1  # all clean-flagged + sample 0


# -- R_k's target: per step or cached (global_features) ------------------------------------------------


def _replay_weak(m, ctx, k, state):
    """The weak views the pre-training pass draws for client k from aug_gen ``state``: per chunk of
    eval_batch_size, one weak draw per sample (the un-augmented view draws nothing)."""
    ctx.aug_gen.set_state(state)
    views = [m.pipeline.view("weak", xb, ctx.aug_gen) for xb, _ in ctx.data.train.batches(ctx.data.clients[k],
                                                                                 ctx.settings.eval_batch_size)]
    return torch.cat(views)


@pytest.mark.parametrize("stage", ["warmup", "main"])
def test_cached_global_features_come_from_one_weak_draw_per_sample_before_training(stage):
    settings = dataclasses.replace(RUN, eval_batch_size=32)  # 100 samples a client: 4 chunks
    m, ctx = _method(FedGRParams(warmup_rounds=1, global_features="cached", confidence=0.0), settings, crop=True)
    r, k = (0, 2) if stage == "warmup" else (1, 2)
    m.begin_round(r)
    for name, g in m.globals.items():
        m.workers[name].load_state_dict(g.state_dict())
    start = ctx.aug_gen.get_state()
    prepare = m.prepare_warmup if stage == "warmup" else m.prepare_main
    job = prepare(r, k, m.workers)
    after = ctx.aug_gen.get_state()
    weak = _replay_weak(m, ctx, k, start)
    m.global_model.eval()
    with torch.no_grad():
        logits, feats = m.global_model.forward_features(weak)
    idx = ctx.data.clients[k]
    cached = job.info.features
    assert cached is not None and torch.allclose(cached[idx], feats.float(), atol=1e-6)
    perm = idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(1))]
    assert torch.equal(cached[perm], cached[idx][torch.searchsorted(idx, perm)])  # looked up by sample id
    if stage == "main":  # the pseudo-labels (ε = 0: every sample) come from the same forward pass
        assert torch.equal(m._pseudo[idx], logits.argmax(1))
        # then the revised teacher draws one more weak view per sample: replay it from where the features left
        teacher_weak = _replay_weak(m, ctx, k, ctx.aug_gen.get_state())
        with torch.no_grad():
            t = m.workers["ema"].eval()(teacher_weak).float()
        assert torch.allclose(m._teacher[idx], t, atol=1e-6)
    assert torch.equal(ctx.aug_gen.get_state(), after)  # and nothing else was drawn


def test_per_step_features_are_the_default_and_leave_no_cache():
    assert FedGRParams().global_features == "per_step"
    m, ctx = _method(FedGRParams(warmup_rounds=1))
    m.begin_round(0)
    assert m.prepare_warmup(0, 0, m.workers).info.features is None


@pytest.mark.parametrize("mode", ["per_step", "cached"])
def test_cached_features_spare_the_global_forward_in_every_step(mode):
    settings = dataclasses.replace(RUN, rounds=3)
    m, ctx = _method(FedGRParams(warmup_rounds=1, confidence=0.3, global_features=mode), settings, n_train=160)
    calls = []
    features = m.global_model.features
    m.global_model.features = lambda x: calls.append(len(x)) or features(x)
    df = Simulation(m, ctx, progress=lambda s: None).run()
    assert len(df) == 3 and np.isfinite(df["acc"]).all()
    assert (len(calls) > 0) == (mode == "per_step")


# -- 'pseudo_only': this round's pseudo-labels ------------------------------------------------------


def test_pseudo_only_uses_this_rounds_pseudo_labels_not_older_ones():
    m, ctx = _method(FedGRParams(warmup_rounds=1, high_noise_labels="pseudo_only"))
    idx = ctx.data.clients[0]
    m.noisy_flag[idx] = True
    first = torch.full((len(idx),), -1, dtype=torch.int64)
    first[:2] = B([7, 7])
    m.label_refining(1, 0, first)  # round 1: confident pseudo-labels for samples 0 and 1
    now = torch.full((len(idx),), -1, dtype=torch.int64)
    now[1] = 3
    m.label_refining(2, 0, now)  # round 2: sample 0 has none (its round-1 label must not be used), sample 1 → 3
    # uniform logits: CE = log 10 for a sample with a label; sample 0 counts as a zero
    got = float(m._supervised_terms(torch.zeros(2, 10), idx[:2], B([True, True])).mean())
    assert got == pytest.approx(math.log(10.0) / 2, rel=1e-6)
    assert bool(m.has_reliable[idx[0]])  # Y*_k (the 'reliable' mode) still keeps the older entry
