"""Stream images that stay on disk (ICH, ISIC, ChestX-ray14, Clothing1M).

A DataLoader over this dataset returns uint8 tensors (C, H, W) resized to the
network's input size; augmentation and normalisation then run batched on the
training device (fnlcore.augment), so workers only decode and resize.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError


class ImageFiles(Dataset):
    def __init__(self, paths: Sequence[str], image_size: tuple[int, int], channels: int = 3):
        self.paths = list(paths)
        self.size = (int(image_size[1]), int(image_size[0]))  # PIL wants (W, H)
        self.mode = "RGB" if channels == 3 else "L"

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        try:
            with Image.open(self.paths[i]) as im:
                im = im.convert(self.mode)
                if im.size != self.size:
                    im = im.resize(self.size, Image.BILINEAR)
                arr = np.asarray(im, dtype=np.uint8)
        except OSError as err:
            raise DataError(f"cannot read image {self.paths[i]}: {err}; re-place or re-download it") from err
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return torch.from_numpy(arr.copy()).permute(2, 0, 1), i
