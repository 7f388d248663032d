"""Batched data augmentation on uint8/float image tensors (N, C, H, W), on any device.

One call transforms a whole mini-batch with per-sample random parameters drawn
from a ``torch.Generator``: no per-sample Python, no PIL round trips.
These mirror the torchvision transforms the papers use:
RandomCrop(size, padding, padding_mode) (zero or reflect padding), RandomHorizontalFlip(p) and
RandomAffine(degrees, translate) (nearest-neighbour, zero fill).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator | None, device) -> torch.Tensor:
    return torch.rand(n, generator=gen, device=device) * (hi - lo) + lo


PADDING_MODES = ("constant", "reflect")


def random_crop(
    x: torch.Tensor, padding: int, gen: torch.Generator | None = None, padding_mode: str = "constant"
) -> torch.Tensor:
    """Pad by ``padding`` (zeros, or torchvision's ``reflect``: mirrored without repeating the
    edge) and crop back to the input size at a random offset per sample."""
    if padding <= 0:
        return x
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode={padding_mode!r}; valid: {', '.join(PADDING_MODES)}")
    n, c, h, w = x.shape
    xp = F.pad(x, (padding, padding, padding, padding), mode=padding_mode)
    oy = torch.randint(0, 2 * padding + 1, (n,), generator=gen, device=x.device)
    ox = torch.randint(0, 2 * padding + 1, (n,), generator=gen, device=x.device)
    # Every h x w window of the padded images as a view (n, c, 2p+1, 2p+1, h, w); picking
    # window (oy_i, ox_i) of sample i is one gather indexed per sample, not per pixel
    # (about 4x faster than a 4-D pixel index on the CPU).
    windows = xp.unfold(2, h, 1).unfold(3, w, 1)
    return windows[torch.arange(n, device=x.device), :, oy, ox]


def random_hflip(x: torch.Tensor, p: float = 0.5, gen: torch.Generator | None = None) -> torch.Tensor:
    """Mirror each sample left-right with probability ``p``."""
    flip = torch.rand(x.shape[0], generator=gen, device=x.device) < p
    mask = flip.view(-1, *([1] * (x.dim() - 1)))
    if x.is_floating_point() or x.is_complex():
        return torch.where(mask, x.flip(-1), x)
    # Integer images: exactly one of the two products is non-zero, so this selects like
    # torch.where, which has no fast kernel for uint8 (about 5x slower on the CPU).
    return x.flip(-1) * mask + x * ~mask


def random_affine(
    x: torch.Tensor,
    degrees: float = 10.0,
    translate: tuple[float, float] = (0.02, 0.02),
    gen: torch.Generator | None = None,
) -> torch.Tensor:
    """Rotate by U(-degrees, degrees) and shift by up to ``translate`` x size, per sample."""
    n, _, h, w = x.shape
    ang = _uniform(n, -degrees, degrees, gen, x.device) * (math.pi / 180.0)
    # translate as a fraction of the size; affine_grid works in [-1, 1] units (= 2 * fraction)
    tx = _uniform(n, -translate[0], translate[0], gen, x.device) * 2.0
    ty = _uniform(n, -translate[1], translate[1], gen, x.device) * 2.0
    cos, sin = torch.cos(ang), torch.sin(ang)
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta.to(torch.float32), (n, x.shape[1], h, w), align_corners=False)
    out = F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.to(x.dtype)
