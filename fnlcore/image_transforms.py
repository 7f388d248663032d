"""How images read from files become batches: ``training.image_transform`` as the sizes the
loader workers (fnlcore.imagefiles.ImageFiles) resize and cut each split to.

No torch here: the datasets' decoded cache (fnlcore.datasets.decoded_cache) names its geometry
with it, and the engine's input pipeline (fnlcore.fl.pipeline) crops by it; both sit above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError


# training.image_transform (values: fnlcore.fl.settings.IMAGE_TRANSFORMS): how images read from
# files become batches. In-memory sets (digits, CIFAR, synthetic stand-ins) are stored at the
# network's size, so they always take 'resize'. H x W = the network input (DatasetInfo.image_size),
# S = floor(H / CROP_RATIO) x floor(W / CROP_RATIO) (256 x 256 for 224 x 224); resizes are PIL's
# bilinear (torchvision's Resize on images).
#   resize              every split resized straight to H x W; crop_flip pads by crop_padding (4)
#                       and crops back (the project's pipeline before issue 24)
#   resize_crop         FedCorr's and FedDiv's code on Clothing1M: train Resize((S, S)) then
#                       RandomCrop(H x W) + flip on the device; test Resize((H, W))
#   resize_crop_center  FedGR's (dev) code: train as resize_crop; test Resize(shorter side to
#                       floor(min(H, W) / CROP_RATIO)) + CenterCrop(H x W)
IMAGE_TRANSFORMS = ("resize", "resize_crop", "resize_crop_center")
CROP_RATIO = 0.875


@dataclass(frozen=True)
class ImageLoading:
    """What the loader workers make of a file (fnlcore.imagefiles.ImageFiles), per split."""

    train_size: tuple[int, int]  # exact resize of training images
    test_size: tuple[int, int]  # test images' size: exact resize, or the centre crop after test_short_side
    test_short_side: int | None = None  # resize the shorter side to this first (aspect kept), then centre-crop

    @property
    def crops(self) -> bool:
        """Training batches arrive larger than the network input (the device cuts it)."""
        return self.train_size != self.test_size


def image_loading(transform: str, image_size: tuple[int, int]) -> ImageLoading:
    """The loading of ``training.image_transform`` for a network input ``image_size`` (H, W)."""
    h, w = int(image_size[0]), int(image_size[1])
    if transform == "resize":
        return ImageLoading((h, w), (h, w))
    big = (int(math.floor(h / CROP_RATIO)), int(math.floor(w / CROP_RATIO)))
    if transform == "resize_crop":
        return ImageLoading(big, (h, w))
    if transform == "resize_crop_center":
        return ImageLoading(big, (h, w), int(math.floor(min(h, w) / CROP_RATIO)))
    raise ConfigError(f"image_transform={transform!r}; valid: {', '.join(IMAGE_TRANSFORMS)}")
