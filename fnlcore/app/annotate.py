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

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..fl.context import RunContext, resolve_model_name
from ..fl.data import FederatedData, ImageSource
from ..fl.context import resolve_device
from ..fl.local import predict
from ..fl.pipeline import make_pipeline
from ..fl.sequential import train_epochs
from ..fl.settings import TrainSettings
from ..io import atomic_path, write_npz
from ..models.builder import MODELS
from ..noise.specs import FedNoRoHIDN
from ..spec import check_params

# The annotator settings have one home: the H-IDN noise spec's annotator_* fields. Defaults,
# types and bounds are read from there; AnnotatorSettings only drops the prefix.
_PREFIX = "annotator_"
_SPEC_FIELDS = {f.name[len(_PREFIX):]: f for f in dataclasses.fields(FedNoRoHIDN) if f.name.startswith(_PREFIX)}
# The spec's annotator_* fields alone, so the spec's declared checks run with the config's key names.
_ConfigKeys = dataclasses.make_dataclass(
    "_ConfigKeys", [(f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata)) for f in _SPEC_FIELDS.values()]
)
# No geometric augmentation on images this small (8x8 digits): a 10-degree turn destroys them.
TINY_IMAGE_SIDE = 16


def _default(key: str):
    return _SPEC_FIELDS[key].default


@dataclass(frozen=True)
class AnnotatorSettings:
    """The annotator_* fields of :class:`FedNoRoHIDN` without their prefix (same defaults, same checks)."""

    model: str = _default("model")
    epochs: int = _default("epochs")
    lr: float = _default("lr")
    weight_decay: float = _default("weight_decay")
    batch_size: int = _default("batch_size")
    seed: int = _default("seed")

    def __post_init__(self) -> None:
        keys = _ConfigKeys(**{_PREFIX + k: v for k, v in asdict(self).items()})
        check_params(keys, f"{FedNoRoHIDN.kind} {FedNoRoHIDN.name!r}")  # errors name annotator_<key>
        for k in _SPEC_FIELDS:  # the declared types, as coerced by the check
            object.__setattr__(self, k, getattr(keys, _PREFIX + k))

    @classmethod
    def from_noise_spec(cls, spec: FedNoRoHIDN) -> "AnnotatorSettings":
        return cls(**{k: getattr(spec, _PREFIX + k) for k in _SPEC_FIELDS})


def annotator_training(settings: AnnotatorSettings, image_size: tuple[int, int], channels: int) -> TrainSettings:
    """Every training setting an annotator trains with: its own settings over TrainSettings' defaults
    for the images' geometry. A changed TrainSettings default changes this, and so the annotator's
    identity and its noise set's (:func:`fnlcore.app.identity.annotator_identity`, ``noise_identity``)."""
    name = resolve_model_name(settings.model, channels, tuple(image_size))
    # 'auto' takes ImageNet weights where the architecture has them and the images are RGB
    # (fednoro.md A3: a pretrained ResNet-18); a model named explicitly trains from scratch.
    pretrained = settings.model == "auto" and channels == 3 and MODELS[name].pretrained_weights
    return TrainSettings(
        model=name, pretrained=bool(pretrained), rounds=1, local_epochs=settings.epochs,
        batch_size=settings.batch_size, optimizer="adam", lr=settings.lr, weight_decay=settings.weight_decay,
        augmentation="none" if min(image_size) <= TINY_IMAGE_SIDE else "affine_flip",
        normalize="imagenet" if pretrained else "half", eval_batch_size=512,
    )


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
    training = annotator_training(settings, image_size, channels)
    name = training.model
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
    normalize, augmentation = training.normalize, training.augmentation
    pipeline = make_pipeline(normalize, augmentation, channels, "annotator")
    return RunContext(training, data, pipeline, device, name, tuple(image_size), channels, settings.seed, log=lambda m: None)


def train_annotator(
    labels: np.ndarray,
    num_classes: int,
    settings: AnnotatorSettings,
    image_size: tuple[int, int],
    channels: int,
    images: np.ndarray | None = None,
    paths: list[str] | None = None,
    device: str | torch.device = "auto",
) -> tuple[dict, np.ndarray, str]:
    """Train on (images or paths, clean labels); return (state_dict, probabilities (n, C), model name).

    The seed fixes every draw: the model's initialisation, the batch order and the augmentation.
    """
    if (images is None) == (paths is None):
        raise ValueError("train_annotator needs exactly one of images or paths")
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    ctx = annotator_context(labels, num_classes, settings, tuple(image_size), channels, images, paths, dev)
    torch.manual_seed(settings.seed)  # model initialisation (batch order and augmentation: ctx's streams)
    model = ctx.new_model()
    given = ctx.data.given
    train_epochs(ctx, model, ctx.data.clients[0], lambda m, x, idx, step: F.cross_entropy(m(x), given[idx.to(given.device)]), 0)
    logits = predict(ctx, model, ctx.data.train)  # eval pipeline, sample order
    probs = torch.softmax(logits.double(), dim=1).cpu().numpy()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}, probs, ctx.model_name


def save_annotator(checkpoint_path: str | Path, probs_path: str | Path, state: dict, probs: np.ndarray,
                   sample_ids: np.ndarray, settings: AnnotatorSettings, model_name: str, client: int) -> None:
    """Write the checkpoint and the per-sample probabilities atomically."""
    with atomic_path(checkpoint_path, suffix=".pt") as tmp:
        torch.save({"state_dict": state, "settings": asdict(settings), "model": model_name, "client": client}, tmp)
    write_npz(probs_path, sample_id=np.asarray(sample_ids, dtype=np.int64), probs=probs)
