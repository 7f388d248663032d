"""Stream images that stay on disk (ICH, ISIC, ChestX-ray14, Clothing1M).

A DataLoader over this dataset returns uint8 tensors (C, H, W) of one size:
each image resized to ``image_size`` (torchvision's ``Resize((H, W))``), or with
``short_side`` its shorter side resized to that length, aspect kept, then the
central ``image_size`` cut (``Resize(short_side)`` + ``CenterCrop(image_size)``),
both with PIL's bilinear filter as torchvision applies them to images
(fnlcore.image_transforms.image_loading: which one each split gets). Augmentation and
normalisation then run batched on the training device (fnlcore.augment), so
workers only decode, resize and cut.

With ``cache`` (a decoded cache of these files at this geometry,
fnlcore.datasets.decoded_cache) item i is row i of that memory-mapped array
instead: the same pixels, without decoding.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError


class ImageFiles(Dataset):
    def __init__(
        self, paths: Sequence[str], image_size: tuple[int, int], channels: int = 3, short_side: int | None = None,
        cache: str | os.PathLike | None = None,
    ):
        self.paths = list(paths)
        self.cache = None if cache is None else str(cache)
        self._pixels: np.ndarray | None = None  # the cache, mapped on first use in each worker process
        self.size = (int(image_size[1]), int(image_size[0]))  # PIL wants (W, H)
        self.mode = "RGB" if channels == 3 else "L"
        self.short_side = None if short_side is None else int(short_side)
        if self.short_side is not None and self.short_side < min(self.size):
            raise ValueError(f"short_side={short_side} is smaller than the crop {image_size}")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.cache is not None:
            return torch.from_numpy(np.array(self._cached()[i])), i
        from PIL import Image  # lazy: PIL only where image files are decoded

        try:
            with Image.open(self.paths[i]) as im:
                im = im.convert(self.mode)
                if self.short_side is not None:
                    im = center_crop(resize_short_side(im, self.short_side), self.size)
                elif im.size != self.size:
                    im = im.resize(self.size, Image.BILINEAR)
                arr = np.asarray(im, dtype=np.uint8)
        except OSError as err:
            raise DataError(f"cannot read image {self.paths[i]}: {err}; re-place or re-download it") from err
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return torch.from_numpy(arr.copy()).permute(2, 0, 1), i

    def _cached(self) -> np.ndarray:
        # mapped lazily: a worker started by spawn (not fork) gets the path, not a copy of the pages
        if self._pixels is None:
            try:
                self._pixels = np.load(self.cache, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError, EOFError) as err:  # empty, truncated or not a .npy: name the file
                if isinstance(err, FileNotFoundError):
                    raise
                raise DataError(f"{self.cache}: not a readable decoded-image cache ({type(err).__name__}: {err}); "
                                f"delete it and rerun with `--forcerun {self.cache}` so the workflow builds it "
                                "again") from None
        return self._pixels

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pixels": None}


def short_side_size(w: int, h: int, short: int) -> tuple[int, int]:
    """(W, H) of torchvision's Resize(short) for a w x h image: the shorter side becomes
    ``short``, the longer int(short * long / shorter) (truncated, as torchvision computes it)."""
    if w <= h:
        return short, int(short * h / w)
    return int(short * w / h), short


def resize_short_side(im, short: int):
    """torchvision's Resize(short) on a PIL image (bilinear); unchanged when already that size."""
    from PIL import Image  # lazy: PIL only where image files are decoded

    size = short_side_size(im.size[0], im.size[1], short)
    return im if size == im.size else im.resize(size, Image.BILINEAR)


def center_crop(im, size: tuple[int, int]):
    """torchvision's CenterCrop on a PIL image; ``size`` is (W, H) here, as PIL writes sizes.
    top = round((h - th) / 2), left likewise (Python's round, as torchvision)."""
    w, h = im.size
    tw, th = size
    top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
    return im.crop((left, top, left + tw, top + th))
