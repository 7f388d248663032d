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

Annotators train through the engine, like every federated client: the client's
samples as an ``ImageSource`` (memory or disk), the batched input pipeline
(affine+flip for large images, none for tiny ones such as 8x8 digits; ImageNet
normalisation for pretrained networks, 0.5/0.5 otherwise), ``train_epochs`` with
Adam, and ``predict`` for the probabilities.

Each annotator is its own Snakemake job with its own cached checkpoint, and
depends only on the partition and these settings, so all noise settings that
make a client noisy share it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..fl.context import RunContext
from ..fl.data import FederatedData, ImageSource
from ..fl.local import predict, train_epochs
from ..fl.pipeline import make_pipeline
from ..fl.device import resolve_device
from ..fl.settings import TrainSettings
from ..models.builder import default_model_for
from ..noise.specs import FedNoRoHIDN

# The annotator defaults have one home: the H-IDN noise spec's annotator_* fields.
_DEFAULTS = {f.name[len("annotator_"):]: f.default for f in fields(FedNoRoHIDN) if f.name.startswith("annotator_")}
# No geometric augmentation on images this small (8x8 digits): a 10-degree turn destroys them.
TINY_IMAGE_SIDE = 16


@dataclass(frozen=True)
class AnnotatorSettings:
    model: str = _DEFAULTS["model"]
    epochs: int = _DEFAULTS["epochs"]
    lr: float = _DEFAULTS["lr"]
    weight_decay: float = _DEFAULTS["weight_decay"]
    batch_size: int = _DEFAULTS["batch_size"]
    seed: int = _DEFAULTS["seed"]

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"annotator_epochs={self.epochs} must be >= 1")
        if self.batch_size < 1:
            raise ConfigError(f"annotator_batch_size={self.batch_size} must be >= 1")
        if not self.lr > 0:
            raise ConfigError(f"annotator_lr={self.lr} must be > 0")

    @classmethod
    def from_noise_spec(cls, spec) -> "AnnotatorSettings":
        return cls(**{k: getattr(spec, f"annotator_{k}") for k in _DEFAULTS})


def annotator_context(
    labels: np.ndarray,
    num_classes: int,
    settings: AnnotatorSettings,
    image_size: tuple[int, int],
    channels: int,
    images: np.ndarray | None,
    paths: list[str] | None,
    device: torch.device,
) -> RunContext:
    """One client holding every given sample, as the engine sees a federated client."""
    name = default_model_for(channels, image_size) if settings.model == "auto" else settings.model
    pretrained = name in ("resnet18", "resnet50") and settings.model == "auto"
    if images is not None:
        source = ImageSource(device, images=images)
    else:
        workers = min(4, torch.get_num_threads())
        source = ImageSource(device, paths=paths, image_size=image_size, channels=channels, workers=workers)
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64), device=device)
    data = FederatedData(
        train=source, test=source, y_true=y, given=y, y_test=y,
        clients=[torch.arange(len(source), dtype=torch.int64)], num_classes=num_classes,
    )
    augmentation = "none" if image_size[0] <= TINY_IMAGE_SIDE else "affine_flip"
    normalize = "imagenet" if pretrained else "half"
    training = TrainSettings(
        model=name, pretrained=pretrained, rounds=1, local_epochs=settings.epochs, batch_size=settings.batch_size,
        optimizer="adam", lr=settings.lr, weight_decay=settings.weight_decay,
        augmentation=augmentation, normalize=normalize, eval_batch_size=512,
    )
    pipeline = make_pipeline(normalize, augmentation, channels, "annotator")
    torch.manual_seed(settings.seed)  # model initialisation
    return RunContext(training, data, pipeline, device, name, tuple(image_size), channels, settings.seed, log=lambda m: None)


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
    if (images is None) == (paths is None):
        raise ValueError("train_annotator needs exactly one of images or paths")
    ctx = annotator_context(labels, num_classes, settings, tuple(image_size), channels, images, paths, resolve_device(device))
    model = ctx.new_model()
    given = ctx.data.given
    train_epochs(ctx, model, ctx.data.clients[0], lambda m, x, idx, step: F.cross_entropy(m(x), given[idx.to(given.device)]), 0)
    logits = predict(ctx, model, ctx.data.train)  # eval pipeline, sample order
    probs = torch.softmax(logits.double(), dim=1).cpu().numpy()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}, probs, ctx.model_name


def save_annotator(checkpoint_path: str | Path, probs_path: str | Path, state: dict, probs: np.ndarray,
                   sample_ids: np.ndarray, settings: AnnotatorSettings, model_name: str, client: int) -> None:
    """Write the checkpoint and the per-sample probabilities atomically."""
    from ..io import atomic_path, write_npz

    with atomic_path(checkpoint_path, suffix=".pt") as tmp:
        torch.save({"state_dict": state, "settings": asdict(settings), "model": model_name, "client": client}, tmp)
    write_npz(probs_path, sample_id=np.asarray(sample_ids, dtype=np.int64), probs=probs)
