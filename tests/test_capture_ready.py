"""The batched engine's capture-ready step (fnlcore.fl.batched) equals its ordinary step on the CPU.

``training.cuda_graphs`` captures a plain chunk's step as CUDA graphs, which needs fixed shapes (every
step the full batch wide, short and missing batches padded and masked), inputs staged in fixed
buffers and an optimiser whose state is updated in place. A CPU cannot capture, so these tests run
that same step eagerly (``train_clients(..., fixed_shapes=True)``) and compare it with today's step;
what a GPU adds (capture and replay) is measured by ``fnl device-check``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from fnlcore.errors import ConfigError
from fnlcore.fl.batched import train_clients
from fnlcore.fl.batched import StepRunner, graphable
from fnlcore.fl.contract import capturable, is_capturable
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.stacked import StackedAdam, StackedSGD
from fnlcore.methods import METHODS

from .engine_helpers import make_ctx


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32 if t.element_size() == 4 else torch.int64)


def _bn_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def _train(settings: TrainSettings, sizes: list[int], fixed: bool, bn: bool = False):
    """One chunk of FedAvg clients holding ``sizes`` samples (the ragged ones padded), on a fresh run."""
    ctx = make_ctx(settings, seed=0)
    method = METHODS["fedavg"](METHODS["fedavg"].Params(), ctx)
    start = [0] + list(torch.tensor(sizes).cumsum(0).tolist())
    clients = [torch.arange(a, b) for a, b in zip(start, start[1:])]
    model = _bn_model() if bn else method.global_model
    states, losses = train_clients(ctx, model, clients, method.loss, 0, fixed_shapes=fixed)
    return states, losses, method


CASES = {
    # clients of different sizes: ragged last batches (13, 5 rows) and a client whose steps end early
    "sgd_crop_flip": (dict(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4, augmentation="crop_flip"),
                      [45, 21, 16]),
    "adam": (dict(optimizer="adam", lr=3e-3, weight_decay=5e-4), [45, 21, 16]),
    # equal clients with an equally short last batch: today's step runs it narrower, unmasked
    "sgd_equal_ragged": (dict(optimizer="sgd", lr=0.05, momentum=0.5), [40, 40]),
    "full_batches": (dict(optimizer="sgd", lr=0.05, momentum=0.9), [32, 48]),
    # BatchNorm: padded rows leave the batch statistics, which then sum over more (zero) rows than
    # today's narrower step: equal up to float rounding (ROUNDING); full steps are today's bit for bit
    "batchnorm": (dict(optimizer="sgd", lr=0.05, momentum=0.9), [45, 21, 16]),
    "batchnorm_equal_ragged": (dict(optimizer="sgd", lr=0.05, momentum=0.9), [40, 40]),
    "batchnorm_full_batches": (dict(optimizer="adam", lr=3e-3), [32, 48]),
}
ROUNDING = {"batchnorm", "batchnorm_equal_ragged"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_capture_ready_step_equals_todays_step(case):
    """Every client's parameters, BatchNorm statistics and step counts after a chunk: bit for bit, but
    for a BatchNorm model's padded steps (ROUNDING)."""
    extra, sizes = CASES[case]
    settings = TrainSettings(rounds=2, local_epochs=2, batch_size=16, engine="batched", **extra)
    bn = case.startswith("batchnorm")
    ref_states, ref_losses, _ = _train(settings, sizes, fixed=False, bn=bn)
    states, losses, _ = _train(settings, sizes, fixed=True, bn=bn)
    assert len(states) == len(ref_states)
    for i, (a, b) in enumerate(zip(ref_states, states)):
        for key in a:
            if a[key].is_floating_point():
                tol = dict(rtol=1e-5, atol=1e-6) if case in ROUNDING else dict(rtol=0, atol=0)
                torch.testing.assert_close(b[key], a[key], **tol, msg=lambda m: f"client {i} {key}: {m}")
            else:
                assert torch.equal(a[key], b[key]), f"client {i} {key}"
    # a padded step's loss value sums its rows with the padded zeros: equal up to the last bits (its
    # gradient, 1 / real rows a row, is the same: the parameters above are bit for bit today's)
    assert losses == pytest.approx(ref_losses, rel=1e-6)


def test_fixed_buffers_and_forms():
    """Each form (every row real / some masked) gets its buffers once; later steps reuse them."""
    seen = []

    def body(buf, masked):
        seen.append((masked, {n: t.data_ptr() for n, t in buf.items()}))
        return buf["idx"].float().sum(1)

    run = StepRunner(body)
    for t in range(4):
        inputs = {"idx": torch.full((2, 3), t), "step": torch.tensor([t, t])}
        if t == 3:
            inputs["mask"] = torch.ones(2, 3, dtype=torch.bool)
        out = run.step(inputs, masked=t == 3)
        assert out.tolist() == [3.0 * t] * 2
    assert len(run.buffers) == 2
    full = [p for m, p in seen if not m]
    assert full[0] == full[1] == full[2]


def test_plain_chunks_only():
    ctx = make_ctx(TrainSettings(rounds=2, engine="batched"), seed=0)
    method = METHODS["fedavg"](METHODS["fedavg"].Params(), ctx)
    assert is_capturable(method.loss)
    assert graphable(method.loss, "train", None, None, None, None, None)
    assert not graphable(method.loss, "raw", None, None, None, None, None)
    assert not graphable(method.loss, "train", None, None, None, lambda sb, s: None, None)
    assert not graphable(lambda sb: sb.logits.sum(), "train", None, None, None, None, None)  # not declared
    assert graphable(capturable(lambda sb: sb.logits.sum()), "train", None, None, None, None, None)


def test_cuda_graphs_is_off_by_default_and_refused_off_cuda():
    assert TrainSettings().cuda_graphs is False
    with pytest.raises(ConfigError, match="cuda_graphs.*engine batched or auto"):
        TrainSettings(engine="sequential", cuda_graphs=True)
    assert TrainSettings(cuda_graphs=True).engine == "default"  # auto on a GPU: allowed, refused off CUDA below
    with pytest.raises(ConfigError, match="must be true or false"):
        TrainSettings(engine="batched", cuda_graphs="yes")
    with pytest.raises(ConfigError, match="needs a CUDA device; this run's device is cpu"):
        make_ctx(TrainSettings(engine="batched", cuda_graphs=True), seed=0)
    with pytest.raises(ConfigError, match="needs a CUDA device; this run's device is cpu"):
        make_ctx(TrainSettings(cuda_graphs=True), seed=0)


@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("active", [None, "mixed"])
def test_capturable_optimiser_same_bits_and_state_in_place(opt, active):
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 4, 5), (3, 7), (3,)]
    p0 = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(4)]
    on = None if active is None else torch.tensor([True, False, True])
    runs = []
    for cap in (False, True):
        params = [p.clone() for p in p0]
        o = (StackedSGD(params, 0.1, momentum=0.9, weight_decay=1e-3, capturable=cap) if opt == "sgd"
             else StackedAdam(params, 1e-2, weight_decay=1e-3, capturable=cap))
        state = o.bufs if opt == "sgd" else o.m + o.v
        ptrs = [s.data_ptr() for s in state]
        for g in grads:
            o.step(g, on)
        now = o.bufs if opt == "sgd" else o.m + o.v
        if cap:  # what a replayed graph reads and writes stays where the capture saw it
            assert [s.data_ptr() for s in now] == ptrs
        runs.append([_bits(p) for p in params] + [_bits(s) for s in now])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_cuda_graphs_enters_a_runs_identity_only_when_on():
    """Added after runs existed: off (the default and every earlier run) leaves every identity as it was."""
    from fnlcore.app.identity import resolved_settings, settings_identity
    from fnlcore.app.runs import train_slug

    off = TrainSettings(engine="batched")
    assert "cuda_graphs" not in resolved_settings(off)
    on = dataclasses.replace(off, cuda_graphs=True)
    assert settings_identity(on) != settings_identity(off)
    assert train_slug(on) != train_slug(off)
