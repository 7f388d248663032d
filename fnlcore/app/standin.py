"""A stand-in of a dataset for the rehearsal: the real shape, classes and size, made-up pixels.

In-memory sets (MNIST, CIFAR) are generated whole, as the real ones are held whole on the
training device: the rehearsal's memory is the real run's. Sets that stream from disk
(ICH, ISIC, ChestX-ray14, Clothing1M: up to a million images) keep one path string per
sample, as a real run does, and make each image from its index when a batch asks for it,
so a million samples cost no disk and no memory beyond the manifest. Decoding is not
rehearsed (see benchmarks/README.md for the loader's own numbers).

Labels: class ``i mod C`` (multi-label: a fixed pseudo-random 0/1 matrix), one sample in five
given a wrong label, so detection steps have something to find. Clients: an IID split of
every sample; each client's list is cut to ``per_client`` samples, which caps its local
steps and every pass a method makes over a client's data.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from ..fl.data import FederatedData, ImageSource
from ..image_transforms import image_loading
from ..datasets import get_dataset


def _pixels(index: int, channels: int, size: tuple[int, int]) -> torch.Tensor:
    """A deterministic uint8 (C, H, W) image of sample ``index``."""
    g = torch.Generator().manual_seed(int(index))
    return torch.randint(0, 256, (channels, *size), generator=g, dtype=torch.uint8)


class GeneratedImages(ImageSource):
    """An on-disk set's stand-in: one path per sample, each image made from its index."""

    def __init__(self, device: torch.device, n: int, image_size: tuple[int, int], channels: int, name: str,
                 short_side: int | None = None):
        paths = [f"{name}/{i:07d}.jpg" for i in range(n)]  # the manifest a real run holds
        super().__init__(device, paths=paths, image_size=image_size, channels=channels, workers=0,
                         short_side=short_side)

    def _file_batches(self, order: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for ids in order.split(batch_size):
            x = torch.stack([_pixels(int(i), self.channels, self.image_size) for i in ids])
            yield x.to(self.device, non_blocking=True), ids


def _labels(n: int, classes: int, multi_label: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.arange(n)
    if multi_label:
        y = (np.random.default_rng(seed).random((n, classes)) < 0.3).astype(np.float32)
        given = y.copy()
        flip = idx % 5 == 0
        given[flip, 0] = 1.0 - given[flip, 0]
        return y, given
    y = idx % classes
    return y, np.where(idx % 5 == 0, (y + 1) % classes, y)


def standin_data(dataset: str, n_train: int, n_test: int, num_clients: int, per_client: int,
                 device: torch.device, image_transform: str = "resize", seed: int = 0) -> FederatedData:
    """The stand-in of ``dataset`` (a registered name) with ``n_train``/``n_test`` samples."""

    info = get_dataset(dataset)
    c, size = info.channels, tuple(info.image_size)
    if info.in_memory:
        rng = np.random.default_rng(seed)
        train = ImageSource(device, images=rng.integers(0, 256, (n_train, *size, c), dtype=np.uint8))
        test = ImageSource(device, images=rng.integers(0, 256, (n_test, *size, c), dtype=np.uint8))
    else:
        load = image_loading(image_transform, size)
        train = GeneratedImages(device, n_train, load.train_size, c, f"{dataset}/train")
        test = GeneratedImages(device, n_test, load.test_size, c, f"{dataset}/test", short_side=load.test_short_side)
    y, given = _labels(n_train, info.num_classes, info.multi_label, seed)
    y_test, _ = _labels(n_test, info.num_classes, info.multi_label, seed + 1)
    as_t = (lambda a: torch.as_tensor(a, dtype=torch.float32, device=device)) if info.multi_label else (
        lambda a: torch.as_tensor(a, dtype=torch.int64, device=device))
    clients = [torch.arange(k, n_train, num_clients, dtype=torch.int64)[:per_client] for k in range(num_clients)]
    return FederatedData(
        train=train, test=test, y_true=as_t(y), given=as_t(given), y_test=as_t(y_test), clients=clients,
        num_classes=info.num_classes, multi_label=info.multi_label, class_names=tuple(info.class_names),
    )
