"""Batched RandAugment, Cutout and mixup on image tensors (N, C, H, W), on any device.

Two parameterisations of RandAugment are used by the papers' code; both draw
``n`` ops with replacement from FixMatch's pool of 14 (identity, autocontrast,
equalize, brightness, color, contrast, sharpness, posterize, solarize, rotate,
shear_x/y, translate_x/y) and end with one Cutout:

* ``fixmatch_mc`` — FixMatch's ``RandAugmentMC(n, m)`` (kekmodel/FixMatch-pytorch;
  FedMLP's FedFixMatch, fedmlp.md §4, baselines.md §16): per op an integer level
  v uniform in {1, ..., m-1} out of 10, the op applied with probability 0.5;
  enhance factor 0.05 + 0.09 v, posterize to 4 + int(0.4 v) bits, solarize at
  256 - int(25.6 v), rotate by int(3 v) degrees, shear 0.03 v, translate
  int(0.03 v x size) pixels, the geometric ones with a random sign; then a
  Cutout of side 16 px filled with grey 127.
* ``fixmatch_uniform`` — the RandAugment of TorchSSL-style FixMatch code that
  FedGR's strong view uses (fedgr.md §4): every op always applied, its value
  uniform over the op's range (``OPS`` below: enhance factor [0.05, 0.95],
  posterize int([4, 8]) bits, solarize threshold [0, 256), rotate [-30, 30]
  degrees, shear [-0.3, 0.3], translate [-0.3, 0.3] x size pixels); then a
  Cutout of side U[0, 0.5) x width filled with (125, 123, 114).

The ops follow PIL's (``ImageOps`` / ``ImageEnhance`` / ``Image.transform``
with NEAREST resampling and black fill, as those codes call them) on integer
pixel values: blends truncate like PIL's, geometric ops sample the input at
the transformed pixel centre. Each sample draws its own ops and levels from a
``torch.Generator``; the loop runs over the 14 op types, never over samples.
Given the same argument, every op returns PIL's pixel values (tests compare
them with PIL); float error can differ from PIL's at exact pixel boundaries
of rotations by non-right angles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import numerics
from .augment import draw_device, on
from .errors import ConfigError
from .syncs import host_side

# op name -> (low, high) of its value range (FixMatch's pool, as the uniform kind draws it)
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
KINDS = ("fixmatch_mc", "fixmatch_uniform")
GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
_ENHANCE = ("brightness", "color", "contrast", "sharpness")
# FixMatch MC: an op's value for level v (out of 10) is v * max / 10 + bias (then int() where marked)
_MC = {
    "brightness": (0.9, 0.05, False), "color": (0.9, 0.05, False), "contrast": (0.9, 0.05, False),
    "sharpness": (0.9, 0.05, False), "posterize": (4.0, 4.0, True), "solarize": (256.0, 0.0, True),
    "rotate": (30.0, 0.0, True), "shear_x": (0.3, 0.0, False), "shear_y": (0.3, 0.0, False),
    "translate_x": (0.3, 0.0, False), "translate_y": (0.3, 0.0, False),
}
_CUTOUT = {"fixmatch_mc": (127.0,), "fixmatch_uniform": (125.0, 123.0, 114.0)}


@dataclass(frozen=True)
class RandAugmentSpec:
    """``kind`` (see the module doc), ``n`` ops per image, ``m`` the level bound of fixmatch_mc."""

    kind: str = "fixmatch_mc"
    n: int = 2
    m: int = 10

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"randaugment kind={self.kind!r}; valid: {', '.join(KINDS)}")
        if self.n < 1:
            raise ConfigError(f"randaugment n={self.n} must be >= 1")
        if not 2 <= self.m <= 10:
            raise ConfigError(f"randaugment m={self.m} must be in 2..10 (levels are drawn from 1..m-1)")


def rand_augment(x: torch.Tensor, spec: RandAugmentSpec, gen: torch.Generator | None = None) -> torch.Tensor:
    """RandAugment then Cutout on a batch of pixel values 0..255; returns the input's dtype and shape."""
    return apply_rand_augment(x, spec, draw_rand_augment(x.shape[0], spec, gen, x.device, tuple(x.shape[-2:])))


def draw_rand_augment(n: int, spec: RandAugmentSpec, gen: torch.Generator | None, device,
                      size: tuple[int, int]) -> tuple:
    """The random parameters :func:`rand_augment` draws for ``n`` images of ``size`` (h, w), in its order.

    Per slot (op, level, sign, apply), then the Cutout side and the uniform centre draws; no
    draw depends on pixel values, so drawing first and applying later (the batched-clients
    engine draws every client's batches in the sequential order, then augments them together)
    gives the same images and leaves ``gen`` in the same state."""
    device = draw_device(gen, device)
    slots = []
    for _ in range(spec.n):
        op = torch.randint(0, len(OP_NAMES), (n,), generator=gen, device=device)
        if spec.kind == "fixmatch_mc":
            level = torch.randint(1, spec.m, (n,), generator=gen, device=device).float()
            sign = torch.where(torch.rand(n, generator=gen, device=device) < 0.5, -1.0, 1.0)
            apply = torch.rand(n, generator=gen, device=device) < 0.5
        else:
            level = torch.rand(n, generator=gen, device=device)
            sign = torch.ones(n, device=device)
            apply = torch.ones(n, dtype=torch.bool, device=device)
        slots.append((op, level, sign, apply))
    if spec.kind == "fixmatch_mc":
        side = torch.full((n,), 16.0, device=device)
    else:
        side = torch.rand(n, generator=gen, device=device) * 0.5 * size[1]
    return tuple(slots), side, draw_cutout_centre(n, gen, device)


def apply_rand_augment(x: torch.Tensor, spec: RandAugmentSpec, params: tuple) -> torch.Tensor:
    """:func:`rand_augment` with parameters from :func:`draw_rand_augment`."""
    slots, side, centre = params
    out = x.float()
    for op, level, sign, apply in slots:
        out = _apply_slot(out, op, level, sign, apply, spec.kind)
    out = cutout_at(out, side, centre, _CUTOUT[spec.kind])
    return out.to(x.dtype) if not x.is_floating_point() else out


def op_value(name: str, level: torch.Tensor, sign: torch.Tensor, kind: str, size: tuple[int, int]) -> torch.Tensor:
    """The op's argument as PIL receives it: enhance factor, bits, threshold, degrees, shear or pixels.

    ``level``: the integer level 1..9 (fixmatch_mc) or a uniform fraction in [0, 1) (fixmatch_uniform).
    ``size``: (height, width) of the images, for translations.
    """
    if kind == "fixmatch_mc":
        top, bias, to_int = _MC[name]
        v = level * top / 10.0
        v = (torch.floor(v) if to_int else v) + bias
        if name in GEOMETRIC:
            v = v * sign
        if name == "solarize":
            v = 256.0 - v
    else:
        lo, hi = OPS[name]
        v = lo + (hi - lo) * level
        if name == "posterize":
            v = torch.floor(v).clamp_min(1.0)
    if name == "translate_x":
        v = v * size[1]
        return torch.trunc(v) if kind == "fixmatch_mc" else v
    if name == "translate_y":
        v = v * size[0]
        return torch.trunc(v) if kind == "fixmatch_mc" else v
    return v


def _apply_slot(x, op, level, sign, apply, kind) -> torch.Tensor:
    """One RandAugment slot: every sample gets the op it drew (or none).

    Which samples each op takes is decided on the host from the draws (CPU tensors in a run), with
    each op's arguments and the geometric ops' matrices; their indices and values reach the device
    in two non-blocking copies, split there by counts known on the host: no device sync."""
    out = x.clone()
    n, _, h, w = x.shape
    with host_side():
        op, level, sign, apply = (t.cpu() for t in (op, level, sign, apply))  # no-ops on host draws
        theta = torch.zeros(n, 2, 3)
        geo = torch.zeros(n, dtype=torch.bool)
        groups, sels, values = [], [], []
        for i, name in enumerate(OP_NAMES):
            if name == "identity":
                continue
            sel = torch.nonzero((op == i) & apply).flatten()
            if sel.numel() == 0:
                continue
            v = op_value(name, level[sel], sign[sel], kind, (h, w)) if name in _MC else None
            if name in GEOMETRIC:
                theta[sel] = pil_matrix(name, v, (h, w))
                geo[sel] = True
            else:
                groups.append((name, sel.numel(), v is not None))
                sels.append(sel)
                if v is not None:
                    values.append(v.float())
        geo_sel = torch.nonzero(geo).flatten()
        sels.append(geo_sel)
        counts = [len(s) for s in sels]
        index = on(torch.cat(sels), x.device).split(counts)
        payload = on(torch.cat(values + [theta[geo_sel].reshape(-1)]), x.device)
        parts = payload.split([g[1] for g in groups if g[2]] + [6 * len(geo_sel)])
    at = iter(parts)
    for (name, _, has_value), sel in zip(groups, index):
        out[sel] = colour_op(name, x[sel], next(at) if has_value else None)
    if counts[-1]:
        out[index[-1]] = warp(x[index[-1]], parts[-1].view(-1, 2, 3), fill=0.0)
    return out


# -- colour ops (float tensors holding integer pixel values 0..255) ---------------------------


def _gray(x: torch.Tensor) -> torch.Tensor:
    """PIL's RGB -> L (ITU-R 601-2 luma, rounded); a 1-channel image is its own grey."""
    if x.shape[1] == 1:
        return x
    # PIL's fixed point: (19595 R + 38470 G + 7471 B + 2^15) >> 16, exact in float32 (< 2^24)
    w = on(torch.tensor([19595.0, 38470.0, 7471.0]), x.device).view(1, 3, 1, 1)
    return torch.floor(((x * w).sum(1, keepdim=True) + 32768.0) / 65536.0)


def blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's Image.blend(degenerate, x, factor): truncated to integers, clipped to 0..255."""
    f = factor.view(-1, 1, 1, 1)
    return torch.floor((degenerate + f * (x - degenerate)).clamp(0, 255))


def colour_op(name: str, x: torch.Tensor, v: torch.Tensor | None) -> torch.Tensor:
    """A non-geometric op with per-sample argument ``v`` (as :func:`op_value` gives it)."""
    if name == "brightness":
        return blend(torch.zeros_like(x), x, v)
    if name == "color":
        return blend(_gray(x).expand_as(x), x, v)
    if name == "contrast":
        mean = torch.floor(_gray(x).double().mean(dim=(1, 2, 3), keepdim=True) + 0.5).float()
        return blend(mean.expand_as(x), x, v)
    if name == "sharpness":
        return blend(_smooth(x), x, v)
    if name == "autocontrast":
        return autocontrast(x)
    if name == "equalize":
        return equalize(x)
    if name == "posterize":
        q = torch.pow(2.0, (8.0 - v).clamp(0, 8)).view(-1, 1, 1, 1)
        return torch.floor(x / q) * q
    if name == "solarize":
        return torch.where(x < v.view(-1, 1, 1, 1), x, 255.0 - x)
    raise ConfigError(f"unknown colour op {name!r}; valid: {', '.join(n for n in OP_NAMES if n not in GEOMETRIC)}")


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """PIL ImageOps.autocontrast (cutoff 0) per sample and channel."""
    xd = x.double()  # PIL builds the table in Python floats: x * scale - lo * scale, truncated
    lo = xd.amin(dim=(2, 3), keepdim=True)
    hi = xd.amax(dim=(2, 3), keepdim=True)
    scale = 255.0 / (hi - lo).clamp_min(1.0)
    return torch.where(hi > lo, torch.trunc(xd * scale + (-lo * scale)).clamp(0, 255), xd).float()


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (3x3, centre 5, total 13, rounded); the one-pixel border is kept."""
    c = x.shape[1]
    if min(x.shape[-2:]) < 3:
        return x
    k = torch.ones(3, 3, device=x.device)
    k[1, 1] = 5.0
    k = (k / 13.0).expand(c, 1, 3, 3)
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = torch.floor(F.conv2d(x, k, groups=c) + 0.5).clamp(0, 255)
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


# -- geometric ops -------------------------------------------------------------------------


def pil_matrix(name: str, v: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(n, 2, 3) affine maps from output to input pixel coordinates, as PIL's transform/rotate build them."""
    h, w = size
    vd = v.double()
    m = torch.zeros(v.shape[0], 2, 3, dtype=torch.float64, device=v.device)
    m[:, 0, 0] = 1.0
    m[:, 1, 1] = 1.0
    if name == "rotate":  # Image.rotate(v): counter-clockwise about the centre (w/2, h/2)
        a = -vd * (math.pi / 180.0)
        cos, sin = torch.round(numerics.cos(a), decimals=15), torch.round(numerics.sin(a), decimals=15)
        cx, cy = w / 2.0, h / 2.0
        m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = cos, sin, -sin, cos
        m[:, 0, 2] = -cos * cx - sin * cy + cx
        m[:, 1, 2] = sin * cx - cos * cy + cy
    elif name == "shear_x":
        m[:, 0, 1] = vd
    elif name == "shear_y":
        m[:, 1, 0] = vd
    elif name == "translate_x":
        m[:, 0, 2] = vd
    elif name == "translate_y":
        m[:, 1, 2] = vd
    else:
        raise ConfigError(f"unknown geometric op {name!r}; valid: {', '.join(GEOMETRIC)}")
    return m.float()


def warp(x: torch.Tensor, theta: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """Nearest-neighbour affine warp with PIL's sampling: output pixel (i, j) reads input
    floor(theta @ (j + 0.5, i + 0.5, 1)); positions outside the image get ``fill``."""
    n, c, h, w = x.shape
    ys = torch.arange(h, device=x.device, dtype=torch.float32).view(1, h, 1) + 0.5
    xs = torch.arange(w, device=x.device, dtype=torch.float32).view(1, 1, w) + 0.5
    t = theta.view(n, 6, 1, 1)
    sx = t[:, 0] * xs + t[:, 1] * ys + t[:, 2]
    sy = t[:, 3] * xs + t[:, 4] * ys + t[:, 5]
    ix, iy = torch.floor(sx), torch.floor(sy)
    inside = (sx >= 0) & (sy >= 0) & (ix < w) & (iy < h)
    idx = (iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)).long().view(n, 1, h * w).expand(n, c, h * w)
    out = x.reshape(n, c, h * w).gather(2, idx).view(n, c, h, w)
    return torch.where(inside.unsqueeze(1), out, torch.full_like(out, fill))


def cutout(x: torch.Tensor, side: torch.Tensor, fill: tuple[float, ...], gen: torch.Generator | None = None) -> torch.Tensor:
    """FixMatch's CutoutAbs per sample: centre (cx, cy) uniform over the image, x0 = int(max(0, cx - side/2)),
    x1 = int(min(w, x0 + side)), and the rectangle [x0, x1] x [y0, y1] (inclusive, as PIL draws it)
    filled with ``fill`` (one value per channel, or one for all). A side <= 0 leaves the sample unchanged."""
    return cutout_at(x, side, draw_cutout_centre(x.shape[0], gen, x.device), fill)


def draw_cutout_centre(n: int, gen: torch.Generator | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The uniform (u_x, u_y) of :func:`cutout`'s centres, in its draw order (cx = u_x w, cy = u_y h)."""
    device = draw_device(gen, device)
    return torch.rand(n, generator=gen, device=device), torch.rand(n, generator=gen, device=device)


def cutout_at(x: torch.Tensor, side: torch.Tensor, centre: tuple[torch.Tensor, torch.Tensor],
              fill: tuple[float, ...]) -> torch.Tensor:
    """:func:`cutout` at the centres drawn by :func:`draw_cutout_centre`."""
    n, c, h, w = x.shape
    # the rectangles where the draws are (the host in a run), then one copy to the images' device
    cx, cy = centre[0] * w, centre[1] * h
    x0 = torch.floor((cx - side / 2.0).clamp_min(0))
    y0 = torch.floor((cy - side / 2.0).clamp_min(0))
    x1 = torch.floor(torch.minimum(x0 + side, torch.full_like(x0, w)))
    y1 = torch.floor(torch.minimum(y0 + side, torch.full_like(y0, h)))
    box = on(torch.stack([x0, y0, x1, y1, (side > 0).to(x0.dtype)]), x.device)
    x0, y0, x1, y1, some = box[0], box[1], box[2], box[3], box[4] > 0
    cols = torch.arange(w, device=x.device).view(1, -1)
    rows = torch.arange(h, device=x.device).view(1, -1)
    in_x = (cols >= x0.view(-1, 1)) & (cols <= x1.view(-1, 1))
    in_y = (rows >= y0.view(-1, 1)) & (rows <= y1.view(-1, 1))
    mask = (in_y[:, :, None] & in_x[:, None, :] & some.view(-1, 1, 1)).unsqueeze(1)
    values = fill if len(fill) == c else fill[:1] * c
    fill_t = on(torch.tensor(values, dtype=x.dtype), x.device).view(1, c, 1, 1)
    return torch.where(mask, fill_t, x)


# -- mixup ---------------------------------------------------------------------------------


def mixup(
    x: torch.Tensor, y: torch.Tensor, alpha: float, gen: torch.Generator | None = None, keep_major: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """One mixup draw for the batch: lambda ~ Beta(alpha, alpha), partner permutation pi.

    Returns (lambda x + (1 - lambda) x[pi], y, y[pi], lambda). Hard labels: the loss is
    lambda CE(f(x~), y) + (1 - lambda) CE(f(x~), y[pi]) (FedCorr's and FedDiv's form);
    soft or one-hot targets: mix them as ``lambda * y + (1 - lambda) * y[pi]``
    (:func:`mix_targets`). ``keep_major`` uses max(lambda, 1 - lambda), so each mixed
    sample stays closest to its own input (DivideMix's MixMatch). ``x`` must be float.
    """
    if alpha <= 0:
        raise ConfigError(f"mixup alpha={alpha} must be > 0")
    # Beta from two Gammas drawn on the generator, so the draw is seeded; lambda is read where it
    # was drawn (the host in a run: no device sync) and the permutation copied to the batch's device
    device = draw_device(gen, x.device)
    conc = torch.full((2,), float(alpha), device=device)
    g = torch._standard_gamma(conc, generator=gen) if gen is not None else torch._standard_gamma(conc)
    with host_side():
        lam = float(g[0] / (g[0] + g[1]))
    if keep_major:
        lam = max(lam, 1.0 - lam)
    perm = on(torch.randperm(x.shape[0], generator=gen, device=device), x.device)
    return lam * x + (1.0 - lam) * x[perm], y, y[perm], lam


def mix_targets(ya: torch.Tensor, yb: torch.Tensor, lam: float) -> torch.Tensor:
    """lambda ya + (1 - lambda) yb for soft (float) targets."""
    return lam * ya + (1.0 - lam) * yb
