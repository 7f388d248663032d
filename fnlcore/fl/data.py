"""The data of one federated run, placed on the training device once.

In-memory sets (digits, MNIST, CIFAR, synthetic stand-ins) live as one uint8
tensor (N, C, H, W) on the device; a mini-batch is an index gather, so the
training loop has no per-sample Python and no host-device copies. Large image
sets stream from their file manifest through a DataLoader (decode + resize in
workers); augmentation then runs batched on the device for both.

Labels are tensors on the device too. ``given`` is the working copy of the
noisy labels: methods relabel through ``FederatedData.relabel``, so overrides
persist across rounds, are checkpointed, and are recorded (``relabels.parquet``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from ..assignment import ClientAssignment
from .relabels import RelabelLog
from ..imagefiles import ImageFiles


# In-memory gathers are done in blocks of whole batches of about this many bytes (a view per batch).
GATHER_BLOCK_BYTES = 4 << 20


def trim_last_batch(order: torch.Tensor, batch_size: int, drop_last: bool) -> torch.Tensor:
    """``order`` without its short last batch under ``drop_last`` (kept when it is the only one)."""
    n = len(order)
    stop = n - n % batch_size if drop_last and n >= batch_size else n
    return order if stop == n else order[:stop]


class ImageSource:
    """Images of one split, in memory on the device or streamed from disk."""

    def __init__(
        self,
        device: torch.device,
        images: np.ndarray | None = None,
        paths: list[str] | None = None,
        image_size: tuple[int, int] = (224, 224),
        channels: int = 3,
        workers: int = 4,
        short_side: int | None = None,  # files: shorter side to this, then the central image_size (imagefiles)
        cache: str | None = None,  # files: their decoded cache at this geometry (fnlcore.datasets.decoded_cache)
    ):
        if (images is None) == (paths is None):
            raise ValueError("ImageSource needs exactly one of images or paths")
        self.device = device
        self.images = None
        if images is not None:
            arr = np.ascontiguousarray(images)
            if arr.ndim == 3:
                arr = arr[..., None]
            self.images = torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous().to(device)
        self.paths = paths
        self.image_size = tuple(image_size)
        self.channels = channels
        self.workers = workers
        self.short_side = short_side
        self.cache = cache

    def __len__(self) -> int:
        return len(self.images) if self.images is not None else len(self.paths)

    @property
    def in_memory(self) -> bool:
        return self.images is not None

    def batches(self, order: torch.Tensor, batch_size: int, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Iterate (uint8 images on device, sample indices on CPU) for ``order`` (CPU int64) in chunks."""
        order = trim_last_batch(order, batch_size, drop_last)
        if self.images is not None:
            return self._memory_batches(order, batch_size)
        return self._file_batches(order, batch_size)

    def _memory_batches(self, order: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One gather per block of whole batches (about GATHER_BLOCK_BYTES), each batch a view of it.

        The order goes to the device once per call, and the per-batch step of the
        iteration runs in C (chain over zips of splits): per batch no tensor creation,
        no index conversion, no host-device copy and no Python frame. The values are
        exactly those of a per-batch gather.
        """
        images = self.images
        per_sample = max(math.prod(images.shape[1:]) * images.element_size(), 1)
        block = max(GATHER_BLOCK_BYTES // per_sample // batch_size, 1) * batch_size
        on_device = order if order.device == images.device else order.to(images.device, non_blocking=True)
        blocks = (
            (images.index_select(0, on_device[s : s + block]), order[s : s + block]) for s in range(0, len(order), block)
        )
        return itertools.chain.from_iterable(zip(x.split(batch_size), i.split(batch_size)) for x, i in blocks)

    def _file_batches(self, order: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:

        subset = Subset(ImageFiles(self.paths, self.image_size, self.channels, self.short_side, self.cache), order.tolist())
        loader = DataLoader(
            subset, batch_size=batch_size, shuffle=False, num_workers=self.workers,
            pin_memory=self.device.type == "cuda", persistent_workers=False,
        )
        for x, sample_ids in loader:  # ImageFiles returns each item's own index = its sample id
            yield x.to(self.device, non_blocking=True), sample_ids


@dataclass
class FederatedData:
    """Training split split over clients, with true and given labels, plus the test split."""

    train: ImageSource
    test: ImageSource
    y_true: torch.Tensor  # (N,) int64, or (N, C) float for multi-label; device
    given: torch.Tensor  # working (noisy, possibly relabelled) labels, same shape; device
    y_test: torch.Tensor  # device
    clients: list[torch.Tensor]  # CPU int64 sample indices per client, in the client's order
    num_classes: int
    multi_label: bool = False
    active: torch.Tensor | None = None  # (N, C) float 0/1: classes annotated for each sample (FedMLP)
    class_names: tuple[str, ...] = ()
    relabels: RelabelLog = field(default_factory=RelabelLog)  # every change of ``given`` made by ``relabel``

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def wrong_label_clients(self) -> np.ndarray:
        """(K,) bool: which clients hold any given label that is not the true one (one copy to the host)."""
        wrong = (self.given != self.y_true).cpu().numpy()
        if wrong.ndim > 1:  # multi-label: any class of the sample
            wrong = wrong.any(axis=1)
        return np.array([bool(wrong[i.numpy()].any()) for i in self.clients])

    def sizes(self) -> np.ndarray:
        return np.array([len(c) for c in self.clients], dtype=np.int64)

    def class_counts(self, labels: torch.Tensor | None = None) -> torch.Tensor:
        """(K, C) counts of the given (or supplied) labels per client, on the device."""
        y = self.given if labels is None else labels
        out = torch.zeros(self.num_clients, self.num_classes, dtype=torch.float64, device=y.device)
        for k, idx in enumerate(self.clients):
            yk = y[idx.to(y.device)]
            out[k] = yk.sum(0).double() if self.multi_label else torch.bincount(yk, minlength=self.num_classes).double()
        return out

    def relabel(self, idx: torch.Tensor, labels: torch.Tensor, round_index: int, stage: str, client: int = -1) -> int:
        """Overwrite the working labels of samples ``idx`` (persisting) and record the changes; returns how many changed."""
        return self.relabels.apply(self.given, idx, labels, round_index, stage, client)

    def assignment(self) -> ClientAssignment:
        return ClientAssignment(num_samples=len(self.train), clients=tuple(c.numpy() for c in self.clients))
