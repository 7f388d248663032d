"""Batched RandAugment, Cutout and mixup on image tensors (N, C, H, W), on any device.

Two parameterisations of RandAugment are used by the papers' code:

* ``fixmatch_mc`` (FixMatch's ``RandAugmentMC(n, m)``; FedMLP's FedFixMatch,
  fedmlp.md and baselines.md §16): ``n`` ops drawn with replacement, each applied
  with probability 0.5 at magnitude ``v`` uniform in {1, ..., m-1} (out of 10),
  then a Cutout of a fixed side (16 px) filled with grey 127;
* ``fixmatch_pc`` (FixMatch's ``RandAugmentPC``; FedGR's strong view, fedgr.md §1):
  ``n`` ops drawn with replacement, always applied, each at a magnitude uniform
  over its whole range, then a Cutout of side U[0, 0.5) x width filled with
  (125, 123, 114).

Each sample draws its own ops and magnitudes from a ``torch.Generator``; the
loop runs over the 14 op types, never over samples. The ops mirror PIL's
(``ImageOps`` / ``ImageEnhance``) on uint8 values; geometric ops of one slot
share a single ``grid_sample`` (nearest, grey 128 fill as FixMatch's fillcolor).
Values are not bit-identical to PIL (interpolation, rounding): the
distributions of ops and magnitudes are what the papers specify.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import ConfigError

# op name -> (low, high) of its magnitude range (FixMatch's fixmatch_augment_pool ranges)
OPS: dict[str, tuple[float, float]] = {
    "identity": (0.0, 0.0),
    "autocontrast": (0.0, 0.0),
    "equalize": (0.0, 0.0),
    "brightness": (0.05, 0.95),
    "color": (0.05, 0.95),
    "contrast": (0.05, 0.95),
    "sharpness": (0.05, 0.95),
    "posterize": (4.0, 8.0),
    "solarize": (0.0, 256.0),
    "rotate": (-30.0, 30.0),
    "shear_x": (-0.3, 0.3),
    "shear_y": (-0.3, 0.3),
    "translate_x": (-0.3, 0.3),
    "translate_y": (-0.3, 0.3),
}
OP_NAMES = tuple(OPS)
_GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
# Enhance factors: PIL's factor 1 is the identity; FixMatch maps a [0.05, 0.95] draw v to factor 1.8 v + 0.1.
_ENHANCE = ("brightness", "color", "contrast", "sharpness")


@dataclass(frozen=True)
class RandAugmentSpec:
    """``kind`` fixmatch_mc | fixmatch_pc, ``n`` ops per image, ``m`` magnitude (fixmatch_mc), Cutout fill."""

    kind: str = "fixmatch_mc"
    n: int = 2
    m: int = 10

    def __post_init__(self) -> None:
        if self.kind not in ("fixmatch_mc", "fixmatch_pc"):
            raise ConfigError(f"randaugment kind={self.kind!r}; valid: fixmatch_mc, fixmatch_pc")
        if self.n < 1:
            raise ConfigError(f"randaugment n={self.n} must be >= 1")
        if not 2 <= self.m <= 10:
            raise ConfigError(f"randaugment m={self.m} must be in 2..10")


def rand_augment(x: torch.Tensor, spec: RandAugmentSpec, gen: torch.Generator | None = None) -> torch.Tensor:
    """RandAugment then Cutout on a uint8 batch; returns uint8 of the same shape."""
    n = x.shape[0]
    dev = x.device
    out = x.float()
    for _ in range(spec.n):
        op = torch.randint(0, len(OP_NAMES), (n,), generator=gen, device=dev)
        if spec.kind == "fixmatch_mc":
            # v in {1..m-1} out of 10; symmetric ops take a random sign; applied with probability 0.5
            t = torch.randint(1, spec.m, (n,), generator=gen, device=dev).float() / 10.0
            sign = torch.where(torch.rand(n, generator=gen, device=dev) < 0.5, -1.0, 1.0)
            apply = torch.rand(n, generator=gen, device=dev) < 0.5
        else:
            t = torch.rand(n, generator=gen, device=dev)
            sign = torch.ones(n, device=dev)
            apply = torch.ones(n, dtype=torch.bool, device=dev)
        out = _apply_slot(out, op, t, sign, apply, spec.kind)
    out = out.round_().clamp_(0, 255)
    if spec.kind == "fixmatch_mc":
        side = torch.full((n,), 16.0, device=dev)
        fill = (127.0,)
    else:
        side = torch.rand(n, generator=gen, device=dev) * 0.5 * x.shape[-1]
        fill = (125.0, 123.0, 114.0)
    return cutout(out, side, fill, gen).to(x.dtype)


def magnitude(name: str, t: torch.Tensor, sign: torch.Tensor, kind: str) -> torch.Tensor:
    """The op's parameter for magnitude fraction ``t`` in [0, 1] (and sign, for symmetric ranges under MC)."""
    lo, hi = OPS[name]
    if kind == "fixmatch_mc" and lo == -hi:  # FixMatch MC: |v| = t * max, random sign
        return sign * t * hi
    if kind == "fixmatch_mc" and name == "solarize":  # MC: threshold 256 - t * 256
        return 256.0 - t * 256.0
    if kind == "fixmatch_mc" and name == "posterize":  # MC: bits 8 - int(t * 4)
        return 8.0 - torch.floor(t * 4.0)
    return lo + (hi - lo) * t


def _apply_slot(x, op, t, sign, apply, kind) -> torch.Tensor:
    out = x.clone()
    geo_theta = torch.zeros(x.shape[0], 2, 3, device=x.device)
    geo_theta[:, 0, 0] = 1.0
    geo_theta[:, 1, 1] = 1.0
    geo_mask = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    for i, name in enumerate(OP_NAMES):
        sel = torch.nonzero((op == i) & apply).flatten()
        if sel.numel() == 0 or name == "identity":
            continue
        v = magnitude(name, t[sel], sign[sel], kind)
        if name in _GEOMETRIC:
            geo_theta[sel] = _theta(name, v)
            geo_mask[sel] = True
            continue
        out[sel] = _colour_op(name, x[sel], v)
    if geo_mask.any():
        sel = torch.nonzero(geo_mask).flatten()
        out[sel] = _warp(x[sel], geo_theta[sel], fill=128.0)
    return out


def _gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    w = torch.tensor([0.299, 0.587, 0.114], device=x.device).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    f = factor.view(-1, 1, 1, 1)
    return (degenerate + f * (x - degenerate)).clamp(0, 255)


def _colour_op(name: str, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if name in _ENHANCE:
        factor = 1.8 * v + 0.1
        if name == "brightness":
            return _blend(torch.zeros_like(x), x, factor)
        if name == "color":
            return _blend(_gray(x).expand_as(x), x, factor)
        if name == "contrast":
            mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True).round()
            return _blend(mean.expand_as(x), x, factor)
        return _blend(_smooth(x), x, factor)
    if name == "autocontrast":
        lo = x.amin(dim=(2, 3), keepdim=True)
        hi = x.amax(dim=(2, 3), keepdim=True)
        span = hi - lo
        return torch.where(span > 0, (x - lo) * 255.0 / span.clamp_min(1e-6), x)
    if name == "equalize":
        return equalize(x)
    if name == "posterize":
        shift = (8.0 - v.round()).clamp(0, 8).view(-1, 1, 1, 1)
        q = torch.pow(2.0, shift)
        return torch.floor(x / q) * q
    if name == "solarize":
        th = v.view(-1, 1, 1, 1)
        return torch.where(x < th, x, 255.0 - x)
    raise AssertionError(name)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (3x3, centre 5, total 13); the one-pixel border is kept."""
    c = x.shape[1]
    if min(x.shape[-2:]) < 3:
        return x
    k = torch.ones(3, 3, device=x.device)
    k[1, 1] = 5.0
    k = (k / 13.0).expand(c, 1, 3, 3)
    inner = F.conv2d(x, k, groups=c)
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = inner
    return out


def equalize(x: torch.Tensor) -> torch.Tensor:
    """PIL ImageOps.equalize per sample and channel (float values 0..255 in, same out)."""
    n, c, h, w = x.shape
    flat = x.round().clamp(0, 255).long().view(n * c, h * w)
    hist = torch.zeros(n * c, 256, device=x.device).scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float))
    # PIL: step = (count of all pixels - count of the last non-zero bin) // 255; identity when step == 0
    last = (hist > 0).float().mul(torch.arange(256, device=x.device)).argmax(1, keepdim=True)
    step = torch.div(h * w - hist.gather(1, last), 255, rounding_mode="floor")
    cum = torch.cumsum(hist, 1) - hist  # counts strictly below each value
    lut = torch.div(cum + torch.div(step, 2, rounding_mode="floor"), step.clamp_min(1), rounding_mode="floor").clamp(0, 255)
    mapped = lut.gather(1, flat)
    out = torch.where(step > 0, mapped, flat.float())
    return out.view(n, c, h, w)


def _theta(name: str, v: torch.Tensor) -> torch.Tensor:
    """Affine matrices (normalised coordinates) for geometric ops."""
    m = torch.zeros(v.shape[0], 2, 3, device=v.device)
    m[:, 0, 0] = 1.0
    m[:, 1, 1] = 1.0
    if name == "rotate":
        a = v * (math.pi / 180.0)
        m[:, 0, 0], m[:, 0, 1] = torch.cos(a), -torch.sin(a)
        m[:, 1, 0], m[:, 1, 1] = torch.sin(a), torch.cos(a)
    elif name == "shear_x":
        m[:, 0, 1] = v
    elif name == "shear_y":
        m[:, 1, 0] = v
    elif name == "translate_x":
        m[:, 0, 2] = 2.0 * v  # fraction of the width -> normalised units
    elif name == "translate_y":
        m[:, 1, 2] = 2.0 * v
    return m


def _warp(x: torch.Tensor, theta: torch.Tensor, fill: float) -> torch.Tensor:
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    # fill outside: warp x - fill with zero padding, then add fill back
    return F.grid_sample(x - fill, grid, mode="nearest", padding_mode="zeros", align_corners=False) + fill


def cutout(x: torch.Tensor, side: torch.Tensor, fill: tuple[float, ...], gen: torch.Generator | None = None) -> torch.Tensor:
    """Fill a square of side ``side[i]`` centred at a uniform random pixel of each sample (clipped at the edges)."""
    n, c, h, w = x.shape
    cy = torch.rand(n, generator=gen, device=x.device) * h
    cx = torch.rand(n, generator=gen, device=x.device) * w
    half = (side / 2.0).view(-1, 1)
    ys = torch.arange(h, device=x.device).view(1, -1)
    xs = torch.arange(w, device=x.device).view(1, -1)
    in_y = ((ys - (cy.view(-1, 1) - half).floor()) >= 0) & ((ys - (cy.view(-1, 1) + half).floor()) < 0)
    in_x = ((xs - (cx.view(-1, 1) - half).floor()) >= 0) & ((xs - (cx.view(-1, 1) + half).floor()) < 0)
    mask = (in_y[:, :, None] & in_x[:, None, :]).unsqueeze(1)
    fill_t = torch.tensor(fill if len(fill) == c else fill[:1] * c, dtype=x.dtype, device=x.device).view(1, c, 1, 1)
    return torch.where(mask, fill_t, x)


def mixup(
    x: torch.Tensor, y: torch.Tensor, alpha: float, gen: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """One mixup draw for the batch: lambda ~ Beta(alpha, alpha), partner permutation pi.

    Returns (lambda x + (1 - lambda) x[pi], y, y[pi], lambda); the loss is
    lambda * CE(f(x~), y) + (1 - lambda) * CE(f(x~), y[pi]) (FedCorr's form; also
    works for soft or one-hot ``y``). ``x`` must be float (after normalisation).
    """
    if alpha <= 0:
        raise ConfigError(f"mixup alpha={alpha} must be > 0")
    # Beta from two Gammas drawn on the generator's device, so the draw is seeded
    g = torch._standard_gamma(torch.full((2,), float(alpha), device=x.device), generator=gen) if gen is not None else None
    if g is None:
        g = torch._standard_gamma(torch.full((2,), float(alpha), device=x.device))
    lam = float(g[0] / (g[0] + g[1]))
    perm = torch.randperm(x.shape[0], generator=gen, device=x.device)
    return lam * x + (1.0 - lam) * x[perm], y, y[perm], lam
