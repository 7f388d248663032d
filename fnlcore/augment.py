"""Batched data augmentation on uint8/float image tensors (N, C, H, W), on any device.

One call transforms a whole mini-batch with per-sample random parameters drawn
from a ``torch.Generator``: no per-sample Python, no PIL round trips.
These mirror the torchvision transforms the papers use:
RandomCrop(size, padding, padding_mode) (zero or reflect padding), RandomHorizontalFlip(p) and
RandomAffine(degrees, translate) (nearest-neighbour, zero fill).

Each transform is also split into ``draw_*`` (the random parameters of n samples, in the
order the transform draws them) and ``*_at`` (apply given parameters): the batched-clients
engine draws every client's parameters in the sequential engine's order, then augments
all clients' batches at once with the same values.
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
    return crop_at(x, padding, draw_crop(x.shape[0], padding, gen, x.device), padding_mode)


def draw_crop(n: int, padding: int, gen: torch.Generator | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) offsets of :func:`random_crop` for ``n`` samples, in its draw order."""
    oy = torch.randint(0, 2 * padding + 1, (n,), generator=gen, device=device)
    ox = torch.randint(0, 2 * padding + 1, (n,), generator=gen, device=device)
    return oy, ox


def crop_at(
    x: torch.Tensor, padding: int, offsets: tuple[torch.Tensor, torch.Tensor], padding_mode: str = "constant"
) -> torch.Tensor:
    """Pad, then cut each sample's h x w window at its (row, column) offset."""
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode={padding_mode!r}; valid: {', '.join(PADDING_MODES)}")
    n, c, h, w = x.shape
    oy, ox = offsets
    xp = F.pad(x, (padding, padding, padding, padding), mode=padding_mode)
    # Every h x w window of the padded images as a view (n, c, 2p+1, 2p+1, h, w); picking
    # window (oy_i, ox_i) of sample i is one gather indexed per sample, not per pixel
    # (about 4x faster than a 4-D pixel index on the CPU).
    windows = xp.unfold(2, h, 1).unfold(3, w, 1)
    return windows[torch.arange(n, device=x.device), :, oy, ox]


def random_hflip(x: torch.Tensor, p: float = 0.5, gen: torch.Generator | None = None) -> torch.Tensor:
    """Mirror each sample left-right with probability ``p``."""
    return flip_where(x, draw_flip(x.shape[0], p, gen, x.device))


def draw_flip(n: int, p: float, gen: torch.Generator | None, device) -> torch.Tensor:
    """Which of ``n`` samples :func:`random_hflip` mirrors (bool), in its draw order."""
    return torch.rand(n, generator=gen, device=device) < p


def flip_where(x: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Mirror the samples where ``flip`` is true."""
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
    return affine_at(x, draw_affine(x.shape[0], degrees, translate, gen, x.device))


def draw_affine(
    n: int, degrees: float, translate: tuple[float, float], gen: torch.Generator | None, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(angle in radians, x shift, y shift in [-1, 1] grid units) of :func:`random_affine`, in its draw order."""
    ang = _uniform(n, -degrees, degrees, gen, device) * (math.pi / 180.0)
    # translate as a fraction of the size; affine_grid works in [-1, 1] units (= 2 * fraction)
    tx = _uniform(n, -translate[0], translate[0], gen, device) * 2.0
    ty = _uniform(n, -translate[1], translate[1], gen, device) * 2.0
    return ang, tx, ty


def affine_at(x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate and shift each sample by its own parameters (nearest neighbour, zero fill)."""
    n, _, h, w = x.shape
    ang, tx, ty = params
    cos, sin = torch.cos(ang), torch.sin(ang)
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta.to(torch.float32), (n, x.shape[1], h, w), align_corners=False)
    out = F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.to(x.dtype)
