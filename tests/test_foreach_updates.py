"""The batched engine's optimiser steps and EMA teacher updates (multi-tensor ``torch._foreach_*``
kernels) against the per-parameter loops they replaced, kept here as the reference: the same bits
on the CPU (golden records compare exact bits), for active, riding and mixed clients.

Bits are compared through an integer view, so -0.0 against 0.0 fails and NaN matches NaN. Every case
runs both ways the per-client helpers go: tensor by tensor (the CPU's) and over the concatenation of the
tensors (a GPU's, forced here).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fnlcore import numerics
from fnlcore.fl import stacked
from fnlcore.fl.stacked import StackedAdam, StackedNet, StackedSGD
from fnlcore.fl.copies import StackedCopies


@pytest.fixture(autouse=True, params=["per_tensor", "concatenated"])
def path(request, monkeypatch):
    monkeypatch.setattr(stacked, "_concatenated", lambda like: request.param == "concatenated")
    return request.param


# -- the reference: the per-parameter loops as they were --------------------------------------------


def _on(active, like):
    return active.view(-1, *([1] * (like.dim() - 1)))


@torch.no_grad()
def ref_sgd_step(params, bufs, grads, lr, momentum, wd, active):
    for i, (p, g) in enumerate(zip(params, grads)):
        d = torch.add(g, p, alpha=wd) if wd else g
        if bufs is not None:
            buf = bufs[i]
            new_buf = buf.mul(momentum).add_(d)
            buf.copy_(new_buf if active is None else torch.where(_on(active, p), new_buf, buf))
            d = buf
        if active is None:
            p.add_(d, alpha=-lr)
        else:
            p.copy_(torch.where(_on(active, p), p.add(d, alpha=-lr), p))


@torch.no_grad()
def ref_adam_step(params, ms, vs, steps, grads, lr, betas, eps, wd, active):
    b1, b2 = betas
    steps += 1 if active is None else active.to(steps.dtype)
    t = steps.clamp_min(1)
    step_size = lr / (1 - b1 ** t)
    bc2_sqrt = numerics.sqrt(1 - b2 ** t)
    for p, g, m, v in zip(params, grads, ms, vs):
        if wd:
            g = torch.add(g, p, alpha=wd)
        new_m = m.lerp(g, 1 - b1)
        new_v = v.mul(b2).addcmul_(g, g, value=1 - b2)
        shape = (-1,) + (1,) * (p.dim() - 1)
        denom = (numerics.sqrt(new_v) / bc2_sqrt.to(p.dtype).view(shape)).add_(eps)
        new_p = p - step_size.to(p.dtype).view(shape) * new_m / denom
        if active is None:
            m.copy_(new_m), v.copy_(new_v), p.copy_(new_p)
        else:
            on = _on(active, p)
            m.copy_(torch.where(on, new_m, m)), v.copy_(torch.where(on, new_v, v)), p.copy_(torch.where(on, new_p, p))


@torch.no_grad()
def ref_ema_lerp(teacher, student, weight, stepped):
    t, s = teacher.net.state_dict(), student.net.state_dict()
    for key in teacher.keys:
        on = _on(stepped, t[key])
        new = torch.lerp(t[key], s[key], weight) if t[key].is_floating_point() else s[key]
        t[key].copy_(torch.where(on, new, t[key]))


@torch.no_grad()
def ref_ema_update(teacher, student, decay, stepped):
    t, s = teacher.net.state_dict(), student.net.state_dict()
    for key in teacher.keys:
        shape = (-1,) + (1,) * (t[key].dim() - 1)
        on = stepped.view(shape)
        if not t[key].is_floating_point():
            new = s[key]
        elif isinstance(decay, torch.Tensor):
            new = t[key] * decay.to(t[key].dtype).view(shape) + s[key] * (1.0 - decay).to(t[key].dtype).view(shape)
        else:
            new = t[key].mul(decay).add(s[key], alpha=1.0 - decay)
        t[key].copy_(torch.where(on, new, t[key]))


# -- cases ------------------------------------------------------------------------------------------


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def assert_same(xs, ys, what):
    assert len(xs) == len(ys), what
    for i, (x, y) in enumerate(zip(xs, ys)):
        assert same_bits(x, y), (what, i, tuple(x.shape))


SHAPES = [(64, 3, 3, 3), (64,), (10, 64), (10,), (7,), ()]  # conv, bias, linear, odd lengths, a scalar each


def _specials(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A few -0.0, 0.0, inf and NaN at random places (so a rider must keep them and ignore its own)."""
    flat = t.view(-1)
    for value in (-0.0, 0.0, float("inf"), float("-inf"), float("nan")):
        flat[torch.randint(flat.numel(), (2,), generator=gen)] = value
    return t


def make_params(k, gen, dtypes=(torch.float32,)):
    params = []
    for i, shape in enumerate(SHAPES):
        p = torch.randn(k, *shape, generator=gen, dtype=torch.float64).to(dtypes[i % len(dtypes)])
        params.append(_specials(p, gen) if p.numel() > 20 else p)
    return params


def make_grads(params, gen):
    return [_specials(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype), gen)
            if p.numel() > 20 else torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) for p in params]


def make_mask(kind, k, gen):
    if kind == "none":
        return None
    if kind == "all":
        return torch.ones(k, dtype=torch.bool)
    if kind == "off":
        return torch.zeros(k, dtype=torch.bool)
    mask = torch.rand(k, generator=gen) < 0.5
    if k > 1:  # mixed: at least one of each
        mask[0], mask[1] = True, False
    return mask


KS = [1, 3, 5]
MASKS = ["none", "all", "off", "mixed"]
STEPS = 4


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("wd", [0.0, 5e-4])
def test_sgd_step_bits_equal_per_parameter_loop(k, mask, momentum, wd):
    gen = torch.Generator().manual_seed(k * 100 + MASKS.index(mask) * 10 + int(momentum * 10) + int(wd > 0))
    params = make_params(k, gen)
    ref = [p.clone() for p in params]
    ref_bufs = [torch.zeros_like(p) for p in params] if momentum else None
    opt = StackedSGD(params, 0.05, momentum, wd)
    for _ in range(STEPS):
        grads, active = make_grads(params, gen), make_mask(mask, k, gen)
        ref_sgd_step(ref, ref_bufs, grads, 0.05, momentum, wd, active)
        opt.step(grads, active)
        assert_same(params, ref, "params")
        if momentum:
            assert_same(opt.bufs, ref_bufs, "momentum")


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("wd", [0.0, 5e-4])
def test_adam_step_bits_equal_per_parameter_loop(k, mask, wd):
    gen = torch.Generator().manual_seed(k * 100 + MASKS.index(mask) * 10 + int(wd > 0))
    params = make_params(k, gen)
    ref = [p.clone() for p in params]
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    steps = torch.zeros(k, dtype=torch.float64)
    opt = StackedAdam(params, 1e-3, (0.9, 0.999), 1e-8, wd)
    for _ in range(STEPS):
        grads, active = make_grads(params, gen), make_mask(mask, k, gen)
        ref_adam_step(ref, ms, vs, steps, grads, 1e-3, (0.9, 0.999), 1e-8, wd, active)
        opt.step(grads, active)
        assert_same(params, ref, "params")
        assert_same(opt.m, ms, "m")
        assert_same(opt.v, vs, "v")
        assert same_bits(opt.steps, steps)


@pytest.mark.parametrize("mask", ["none", "mixed"])
def test_optimisers_bits_equal_with_mixed_float_dtypes(mask):
    gen = torch.Generator().manual_seed(7)
    k = 3
    sgd_params = make_params(k, gen, (torch.float32, torch.float64, torch.float16, torch.bfloat16))
    adam_params = [p.clone() for p in sgd_params]
    ref_sgd, ref_adam = [p.clone() for p in sgd_params], [p.clone() for p in sgd_params]
    bufs = [torch.zeros_like(p) for p in sgd_params]
    ms, vs = [torch.zeros_like(p) for p in sgd_params], [torch.zeros_like(p) for p in sgd_params]
    steps = torch.zeros(k, dtype=torch.float64)
    sgd, adam = StackedSGD(sgd_params, 0.05, 0.9, 5e-4), StackedAdam(adam_params, 1e-3, weight_decay=5e-4)
    for _ in range(STEPS):
        grads, active = make_grads(sgd_params, gen), make_mask(mask, k, gen)
        ref_sgd_step(ref_sgd, bufs, grads, 0.05, 0.9, 5e-4, active)
        ref_adam_step(ref_adam, ms, vs, steps, grads, 1e-3, (0.9, 0.999), 1e-8, 5e-4, active)
        sgd.step(grads, active)
        adam.step(grads, active)
        assert_same(sgd_params, ref_sgd, "sgd")
        assert_same(sgd.bufs, bufs, "momentum")
        assert_same(adam_params, ref_adam, "adam")
        assert_same(adam.m, ms, "m")
        assert_same(adam.v, vs, "v")


# -- EMA teachers of two StackedNets ----------------------------------------------------------------


def _template():
    return nn.Sequential(nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def _random_net(k, gen):
    net = StackedNet(_template(), k)
    with torch.no_grad():
        for key, t in net.net.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=gen))
                if t.numel() > 20:
                    _specials(t, gen)
            else:  # num_batches_tracked (K,) long
                t.copy_(torch.randint(0, 1000, t.shape, generator=gen))
    return net


def _state(net):
    return [t.clone() for t in net.net.state_dict().values()]


EMA_MASKS = ["all", "off", "mixed"]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("mask", EMA_MASKS)
@pytest.mark.parametrize("kind", ["lerp", "decay", "per_client_decay"])
def test_batched_ema_bits_equal_per_key_loop(k, mask, kind):
    gen = torch.Generator().manual_seed(k * 100 + EMA_MASKS.index(mask) * 10 + len(kind))
    teacher = _random_net(k, gen)
    ref = copy.deepcopy(teacher)
    assert any(not t.is_floating_point() for t in teacher.net.state_dict().values())  # an integer buffer rides along
    for _ in range(STEPS):
        student = _random_net(k, gen)
        stepped = make_mask(mask, k, gen)
        if kind == "lerp":
            ref_ema_lerp(ref, student, 0.3, stepped)
            StackedCopies(teacher, student).lerp_(0.3, stepped)
        else:
            decay = 0.99 if kind == "decay" else torch.rand(k, generator=gen, dtype=torch.float64)
            ref_ema_update(ref, student, decay, stepped)
            StackedCopies(teacher, student).ema_(decay, stepped)
        assert_same(_state(teacher), _state(ref), kind)
