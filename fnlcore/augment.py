"""Batched data augmentation on uint8/float image tensors (N, C, H, W), on any device.

One call transforms a whole mini-batch with per-sample random parameters drawn
from a ``torch.Generator``: no per-sample Python, no PIL round trips.
These mirror the torchvision transforms the papers use:
RandomCrop(size, padding, padding_mode) (zero or reflect padding; ``size`` smaller than the
input: Clothing1M's RandomCrop(224) of a 256 x 256 resize), CenterCrop(size),
RandomHorizontalFlip(p), RandomAffine(degrees, translate) (nearest-neighbour, zero fill) and
RandomResizedCrop(size) (torchvision's parameter draw, bilinear resampling).

Each transform is also split into ``draw_*`` (the random parameters of n samples, in the
order the transform draws them) and ``*_at`` (apply given parameters): the batched-clients
engine draws every client's parameters in the sequential engine's order, then augments
all clients' batches at once with the same values.

Draws are made where their generator lives (a run's streams are CPU generators: the same draws
on every device, fnlcore.fl.context); ``*_at`` moves the parameters it needs to the images'
device with non-blocking copies, which on a GPU wait for no queued kernel (a blocking copy to
the device synchronises its stream).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F


def draw_device(gen: torch.Generator | None, device) -> torch.device:
    """Where a draw is made: on its generator's device (``device`` for the global stream)."""
    return gen.device if gen is not None else torch.device(device)


def on(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device`` by a non-blocking copy (itself when it is there already)."""
    return t.to(device, non_blocking=True)


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator | None, device) -> torch.Tensor:
    return torch.rand(n, generator=gen, device=draw_device(gen, device)) * (hi - lo) + lo


PADDING_MODES = ("constant", "reflect")


def random_crop(
    x: torch.Tensor,
    padding: int,
    gen: torch.Generator | None = None,
    padding_mode: str = "constant",
    size: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Pad by ``padding`` (zeros, or torchvision's ``reflect``: mirrored without repeating the
    edge) and cut a ``size`` window (default: the input size) at a random offset per sample:
    torchvision's RandomCrop(size, padding)."""
    h, w = x.shape[-2:]
    th, tw = (h, w) if size is None else (int(size[0]), int(size[1]))
    if padding <= 0 and (th, tw) == (h, w):
        return x
    slack = (h - th, w - tw)
    return crop_at(x, padding, draw_crop(x.shape[0], padding, gen, x.device, slack), padding_mode, (th, tw))


def draw_crop(
    n: int, padding: int, gen: torch.Generator | None, device, slack: tuple[int, int] = (0, 0)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) offsets of :func:`random_crop` for ``n`` samples, in its draw order
    (torchvision's: row then column, each uniform over 0..2 padding + input - crop size;
    ``slack`` = input - crop size per axis)."""
    device = draw_device(gen, device)
    oy = torch.randint(0, 2 * padding + int(slack[0]) + 1, (n,), generator=gen, device=device)
    ox = torch.randint(0, 2 * padding + int(slack[1]) + 1, (n,), generator=gen, device=device)
    return oy, ox


def crop_at(
    x: torch.Tensor,
    padding: int,
    offsets: tuple[torch.Tensor, torch.Tensor],
    padding_mode: str = "constant",
    size: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Pad, then cut each sample's ``size`` window (default h x w) at its (row, column) offset."""
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode={padding_mode!r}; valid: {', '.join(PADDING_MODES)}")
    n, c, h, w = x.shape
    th, tw = (h, w) if size is None else (int(size[0]), int(size[1]))
    oy, ox = on(offsets[0], x.device), on(offsets[1], x.device)
    xp = F.pad(x, (padding, padding, padding, padding), mode=padding_mode) if padding > 0 else x
    # Every th x tw window of the padded images as a view (n, c, rows, cols, th, tw); picking
    # window (oy_i, ox_i) of sample i is one gather indexed per sample, not per pixel
    # (about 4x faster than a 4-D pixel index on the CPU).
    windows = xp.unfold(2, th, 1).unfold(3, tw, 1)
    return windows[_rows(n, x.device), :, oy, ox]


@lru_cache(maxsize=32)
def _rows(n: int, device: torch.device) -> torch.Tensor:
    """0..n-1 on ``device``, made once per (n, device): the crop's row index, not a new tensor per batch."""
    return torch.arange(n, device=device)


def center_crop(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """torchvision's CenterCrop(size) of a batch: top = round((h - th) / 2), left likewise
    (Python's round, as torchvision computes it); a size larger than the input is an error."""
    h, w = x.shape[-2:]
    th, tw = int(size[0]), int(size[1])
    if th > h or tw > w:
        raise ValueError(f"center_crop: crop {th}x{tw} larger than the images ({h}x{w})")
    top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
    return x[..., top : top + th, left : left + tw]


def random_resized_crop(
    x: torch.Tensor,
    size: tuple[int, int],
    gen: torch.Generator | None = None,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
) -> torch.Tensor:
    """torchvision's RandomResizedCrop(size, scale, ratio): a box of random area and aspect ratio
    per sample, resized to ``size`` (bilinear, see :func:`resized_crop_at`)."""
    box = draw_resized_crop(x.shape[0], tuple(x.shape[-2:]), gen, x.device, scale, ratio)
    return resized_crop_at(x, box, size)


def draw_resized_crop(
    n: int,
    in_size: tuple[int, int],
    gen: torch.Generator | None,
    device,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    attempts: int = 10,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top, left, height, width) of :func:`random_resized_crop` for ``n`` samples.

    torchvision's ``get_params``, batched: ``attempts`` tries per sample of an area
    U(scale) x H W and a log-uniform aspect ratio, w = round(sqrt(area ratio)),
    h = round(sqrt(area / ratio)); the first try that fits the image wins, its corner
    uniform over the positions that fit; a sample with no fitting try gets torchvision's
    fallback (the central crop of the whole image clamped to ``ratio``). All tries are
    drawn at once (areas, then ratios, then the corners' rows and columns).
    """
    H, W = int(in_size[0]), int(in_size[1])
    area = float(H * W)
    device = draw_device(gen, device)
    s = torch.rand(n, attempts, generator=gen, device=device, dtype=torch.float64) * (scale[1] - scale[0]) + scale[0]
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    ar = torch.exp(torch.rand(n, attempts, generator=gen, device=device, dtype=torch.float64) * (hi - lo) + lo)
    ws = torch.round(torch.sqrt(area * s * ar))
    hs = torch.round(torch.sqrt(area * s / ar))
    fits = (ws > 0) & (ws <= W) & (hs > 0) & (hs <= H)
    first = fits.float().argmax(1, keepdim=True)  # the first fitting try (0 when none fits)
    any_fit = fits.any(1)
    in_ratio = W / H
    if in_ratio < min(ratio):
        fw, fh = W, int(round(W / min(ratio)))
    elif in_ratio > max(ratio):
        fh, fw = H, int(round(H * max(ratio)))
    else:
        fw, fh = W, H
    h = torch.where(any_fit, hs.gather(1, first).squeeze(1), float(fh)).long()
    w = torch.where(any_fit, ws.gather(1, first).squeeze(1), float(fw)).long()
    uy = torch.rand(n, generator=gen, device=device, dtype=torch.float64)
    ux = torch.rand(n, generator=gen, device=device, dtype=torch.float64)
    top = torch.where(any_fit, torch.floor(uy * (H - h + 1)).long(), (H - fh) // 2)
    left = torch.where(any_fit, torch.floor(ux * (W - w + 1)).long(), (W - fw) // 2)
    return top, left, h, w


def resized_crop_at(
    x: torch.Tensor, box: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], size: tuple[int, int]
) -> torch.Tensor:
    """Cut each sample's box (top, left, height, width) and resize it to ``size``, bilinear.

    The values of ``F.interpolate(crop, size, mode='bilinear', align_corners=False)`` on each
    sample's crop (half-pixel centres, edges clamped to the crop), rounded for integer images;
    computed for the whole batch with four gathers. Unlike PIL's resize (what torchvision's
    RandomResizedCrop calls on images) there is no antialiasing when a crop shrinks.
    """
    n, c, H, W = x.shape
    oh, ow = int(size[0]), int(size[1])
    top, left, bh, bw = box

    def axis(start, extent, out):  # source coordinates (n, out): low index, high index, weight of high
        # computed where the boxes were drawn (the host in a run), then moved: equal on every device
        pos = (torch.arange(out, device=start.device, dtype=torch.float64) + 0.5)[None, :]
        src = (pos * (extent.double() / out)[:, None] - 0.5).clamp_min(0.0)
        src = torch.minimum(src, (extent - 1).double()[:, None])
        i0 = torch.floor(src)
        i1 = torch.minimum(i0 + 1, (extent - 1).double()[:, None])
        return (on(i0.long() + start[:, None], x.device), on(i1.long() + start[:, None], x.device),
                on((src - i0).float(), x.device))

    y0, y1, wy = axis(top, bh, oh)
    x0, x1, wx = axis(left, bw, ow)
    xf = x.float()

    def rows(idx):  # (n, c, oh, W)
        return xf.gather(2, idx[:, None, :, None].expand(n, c, oh, W))

    def cols(t, idx):  # (n, c, oh, ow)
        return t.gather(3, idx[:, None, None, :].expand(n, c, oh, ow))

    r0, r1 = rows(y0), rows(y1)
    wy4, wx4 = wy[:, None, :, None], wx[:, None, None, :]
    top_row = cols(r0, x0) * (1 - wx4) + cols(r0, x1) * wx4
    bottom_row = cols(r1, x0) * (1 - wx4) + cols(r1, x1) * wx4
    out = top_row * (1 - wy4) + bottom_row * wy4
    if x.is_floating_point():
        return out.to(x.dtype)
    return out.round_().clamp_(0, 255).to(x.dtype)


def random_hflip(x: torch.Tensor, p: float = 0.5, gen: torch.Generator | None = None) -> torch.Tensor:
    """Mirror each sample left-right with probability ``p``."""
    return flip_where(x, draw_flip(x.shape[0], p, gen, x.device))


def draw_flip(n: int, p: float, gen: torch.Generator | None, device) -> torch.Tensor:
    """Which of ``n`` samples :func:`random_hflip` mirrors (bool), in its draw order."""
    return torch.rand(n, generator=gen, device=draw_device(gen, device)) < p


def flip_where(x: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Mirror the samples where ``flip`` is true."""
    mask = on(flip, x.device).view(-1, *([1] * (x.dim() - 1)))
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
    # the matrices where the draws are (the host in a run: equal on every device), then one copy
    cos, sin = torch.cos(ang), torch.sin(ang)
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(on(theta.to(torch.float32), x.device), (n, x.shape[1], h, w), align_corners=False)
    out = F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.to(x.dtype)
