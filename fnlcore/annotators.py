"""H-IDN annotator networks (FedNoRo, Algorithm 1).

For each noisy client a network is trained on that client's *clean* labels
and then predicts class probabilities p(y|x) for the same samples; FedNoRo's
instance-dependent noise picks samples with probability proportional to
1 - p(true class) and draws the new label from the remaining probabilities.
The paper does not give the architecture or schedule; the defaults follow
fednoro.md A3 (FedNoRo's local optimiser: Adam 3e-4, wd 5e-4, batch 16,
5 epochs, training augmentation; prediction without augmentation), and the
architecture is 'auto': an ImageNet-pretrained ResNet-18 for large images,
a small network for small ones.

Each annotator is its own Snakemake job with its own cached checkpoint, and
depends only on the partition and these settings, so all noise settings that
make a client noisy share it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import augment
from .errors import ConfigError
from .models import build_model
from .models.builder import default_model_for
from .fl.run import resolve_device

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class AnnotatorSettings:
    model: str = "auto"
    epochs: int = 5
    lr: float = 3e-4
    weight_decay: float = 5e-4
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"annotator_epochs={self.epochs} must be >= 1")
        if self.batch_size < 1:
            raise ConfigError(f"annotator_batch_size={self.batch_size} must be >= 1")
        if not self.lr > 0:
            raise ConfigError(f"annotator_lr={self.lr} must be > 0")

    @classmethod
    def from_noise_spec(cls, spec) -> "AnnotatorSettings":
        return cls(
            model=spec.annotator_model,
            epochs=int(spec.annotator_epochs),
            lr=float(spec.annotator_lr),
            weight_decay=float(spec.annotator_weight_decay),
            batch_size=int(spec.annotator_batch_size),
            seed=int(spec.annotator_seed),
        )


class _Inputs:
    """Client images as uint8 batches, from memory or streamed from disk."""

    def __init__(self, images: np.ndarray | None, paths: list[str] | None, image_size, channels: int):
        self.images = None if images is None else torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
        self.paths = paths
        self.image_size = tuple(image_size)
        self.channels = channels

    def __len__(self) -> int:
        return len(self.images) if self.images is not None else len(self.paths)

    def batches(self, order: torch.Tensor, batch_size: int, device: torch.device):
        """Yield (uint8 batch on device, indices) in the given sample order."""
        if self.images is not None:
            imgs = self.images.to(device)
            for s in range(0, len(order), batch_size):
                idx = order[s : s + batch_size]
                yield imgs[idx.to(device)], idx
            return
        from torch.utils.data import DataLoader, Subset

        from .imagefiles import ImageFiles

        ds = Subset(ImageFiles(self.paths, self.image_size, self.channels), order.tolist())
        loader = DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=min(4, torch.get_num_threads()))
        for x, idx in loader:
            yield x.to(device, non_blocking=True), idx


def _normaliser(pretrained: bool, channels: int, device: torch.device):
    if pretrained:
        mean = torch.tensor(IMAGENET_MEAN, device=device)[:, None, None]
        std = torch.tensor(IMAGENET_STD, device=device)[:, None, None]
    else:
        mean = torch.full((channels, 1, 1), 0.5, device=device)
        std = torch.full((channels, 1, 1), 0.5, device=device)
    return lambda x: (x.float() / 255.0 - mean) / std


def train_annotator(
    labels: np.ndarray,
    num_classes: int,
    settings: AnnotatorSettings,
    image_size: tuple[int, int],
    channels: int,
    images: np.ndarray | None = None,
    paths: list[str] | None = None,
    device: str = "auto",
) -> tuple[dict, np.ndarray, str]:
    """Train on (images or paths, clean labels); return (state_dict, probabilities (n, C), model name)."""
    dev = resolve_device(device)
    torch.manual_seed(settings.seed)
    gen = torch.Generator(device="cpu").manual_seed(settings.seed)
    aug_gen = torch.Generator(device=dev).manual_seed(settings.seed)
    name = default_model_for(channels, image_size) if settings.model == "auto" else settings.model
    pretrained = name in ("resnet18", "resnet50") and settings.model == "auto"
    model = build_model(name, num_classes, channels, image_size, pretrained=pretrained).to(dev)
    norm = _normaliser(pretrained, channels, dev)
    data = _Inputs(images, paths, image_size, channels)
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    opt = torch.optim.Adam(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    small = image_size[0] <= 16  # no geometric augmentation on 8x8 digits
    for _ in range(settings.epochs):
        model.train()
        order = torch.randperm(len(data), generator=gen)
        for xb, idx in data.batches(order, settings.batch_size, dev):
            if not small:
                xb = augment.random_hflip(augment.random_affine(xb, 10.0, (0.02, 0.02), aug_gen), 0.5, aug_gen)
            loss = F.cross_entropy(model(norm(xb)), y[idx].to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    probs = predict_proba(model, data, norm, dev, num_classes)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}, probs, name


@torch.no_grad()
def predict_proba(model, data: _Inputs, norm, device: torch.device, num_classes: int, batch_size: int = 512) -> np.ndarray:
    """Softmax probabilities without augmentation, in sample order."""
    model.eval()
    out = np.empty((len(data), num_classes), dtype=np.float64)
    order = torch.arange(len(data))
    for xb, idx in data.batches(order, batch_size, device):
        out[idx.numpy()] = torch.softmax(model(norm(xb)).double(), dim=1).cpu().numpy()
    return out


def save_annotator(checkpoint_path: str | Path, probs_path: str | Path, state: dict, probs: np.ndarray,
                   sample_ids: np.ndarray, settings: AnnotatorSettings, model_name: str, client: int) -> None:
    """Write the checkpoint and the per-sample probabilities atomically."""
    from .io import atomic_path, write_npz

    with atomic_path(checkpoint_path, suffix=".pt") as tmp:
        torch.save({"state_dict": state, "settings": asdict(settings), "model": model_name, "client": client}, tmp)
    write_npz(probs_path, sample_id=np.asarray(sample_ids, dtype=np.int64), probs=probs)


# Re-exported: reading the annotators' outputs needs no torch, so it lives with the noise code.
from .noise.hidn import assemble_soft_labels  # noqa: E402,F401
