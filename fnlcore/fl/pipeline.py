"""Turn uint8 image batches into normalised float batches, with batched training augmentation."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .. import augment
from ..errors import ConfigError
from ..randaugment import RandAugmentSpec, rand_augment

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

# Training augmentations used by the papers (on tensors, see fnlcore.augment):
#   crop_flip   RandomCrop(size, padding=4) + RandomHorizontalFlip   (FedCorr, FedDiv, FedGR weak view)
#   affine_flip RandomAffine(10, translate=(0.02, 0.02)) + RandomHorizontalFlip  (FedNoRo, FedMLP)
#   none        (Fed-NCL, digits)
AUGMENTATIONS = ("none", "crop_flip", "affine_flip")
# Named views of one batch (methods ask for several at once: weak + strong for FixMatch/FedGR,
# two weak draws for FedMLP/RSCFed): 'eval' (no augmentation), 'weak' (= train), 'strong' (the
# train augmentation, its crop padded with ``strong_padding``, then RandAugment + Cutout with the
# pipeline's ``strong`` spec; FedGR's strong view pads by reflection, fedgr.md §4).
VIEWS = ("eval", "weak", "strong")
# The papers' parameters of the geometric transforms (both paths below: train and draw/apply)
FLIP_P, AFFINE_DEGREES, AFFINE_TRANSLATE = 0.5, 10.0, (0.02, 0.02)


@dataclass(frozen=True)
class InputPipeline:
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augmentation: str = "none"
    crop_padding: int = 4
    strong: RandAugmentSpec = RandAugmentSpec()
    strong_padding: str = "constant"  # constant | reflect: the crop padding of the strong view
    channels_last: bool = False  # normalised batches in channels-last memory (training.channels_last)

    def __post_init__(self) -> None:
        if self.augmentation not in AUGMENTATIONS:
            raise ConfigError(f"augmentation={self.augmentation!r}; valid: {', '.join(AUGMENTATIONS)}")
        if self.strong_padding not in augment.PADDING_MODES:
            raise ConfigError(f"strong_padding={self.strong_padding!r}; valid: {', '.join(augment.PADDING_MODES)}")

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # (x / 255 - mean) / std, computed in place on one fresh float copy with mean/std
        # tensors made once per device: same values as the out-of-place form, fewer
        # allocations and no per-batch tensor creation (or host-device copy) on the hot path.
        mean, std = _channel_stats(tuple(self.mean), tuple(self.std), x.device)
        y = x.float() if x.dtype != torch.float32 else x.clone()  # never modify the caller's tensor
        y = y.div_(255.0).sub_(mean).div_(std)
        return y.contiguous(memory_format=torch.channels_last) if self.channels_last and y.dim() == 4 else y

    def train(self, x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """Augment (batched, per-sample random parameters) then normalise."""
        return self._norm(self._geometric(x, gen))

    def eval(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x)

    def draw_train(self, n: int, gen: torch.Generator | None, device) -> tuple:
        """The random parameters ``train`` draws for a batch of ``n``, in the same order from ``gen``.

        ``apply_train(x, draw_train(len(x), gen, x.device))`` equals ``train(x, gen)``, and leaves
        ``gen`` in the same state: the batched-clients engine draws every client's batches in
        the sequential engine's order, then augments all clients at once.
        """
        if self.augmentation == "crop_flip":
            return augment.draw_crop(n, self.crop_padding, gen, device), augment.draw_flip(n, FLIP_P, gen, device)
        if self.augmentation == "affine_flip":
            return (augment.draw_affine(n, AFFINE_DEGREES, AFFINE_TRANSLATE, gen, device),
                    augment.draw_flip(n, FLIP_P, gen, device))
        return ()

    def apply_train(self, x: torch.Tensor, params: tuple) -> torch.Tensor:
        """``train`` with parameters from :meth:`draw_train` (concatenated along samples for several batches)."""
        if self.augmentation == "crop_flip":
            x = augment.flip_where(augment.crop_at(x, self.crop_padding, params[0]), params[1])
        elif self.augmentation == "affine_flip":
            x = augment.flip_where(augment.affine_at(x, params[0]), params[1])
        return self._norm(x)

    def view(self, name: str, x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """One named view (see VIEWS) of a uint8 batch, normalised."""
        if name == "eval":
            return self.eval(x)
        if name == "weak":
            return self.train(x, gen)
        if name == "strong":
            return self._norm(rand_augment(self._geometric(x, gen, self.strong_padding), self.strong, gen))
        raise ConfigError(f"view {name!r}; valid views: {', '.join(VIEWS)}")

    def views(self, x: torch.Tensor, gen: torch.Generator | None, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Several views of the same batch, each drawn independently, batched on its device.

        A name may repeat with a suffix ('weak:1', 'weak:2') for independent draws of one view.
        """
        return {n: self.view(n.split(":", 1)[0], x, gen) for n in names}

    def _geometric(self, x: torch.Tensor, gen: torch.Generator | None, padding_mode: str = "constant") -> torch.Tensor:
        """The train augmentation without normalisation (uint8 in, uint8 out)."""
        if self.augmentation == "crop_flip":
            return augment.random_hflip(augment.random_crop(x, self.crop_padding, gen, padding_mode), FLIP_P, gen)
        if self.augmentation == "affine_flip":
            return augment.random_hflip(augment.random_affine(x, AFFINE_DEGREES, AFFINE_TRANSLATE, gen), FLIP_P, gen)
        return x


@lru_cache(maxsize=64)
def _channel_stats(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """(C, 1, 1) float32 mean and std on ``device``, built once per (values, device)."""
    return tuple(torch.tensor(v, dtype=torch.float32, device=device)[:, None, None] for v in (mean, std))


def make_pipeline(normalize: str | dict, augmentation: str, channels: int, dataset_name: str, sample: torch.Tensor | None = None) -> InputPipeline:
    """Build the pipeline; ``normalize`` is imagenet | half | data | {mean: [...], std: [...]}.

    'data' computes per-channel mean/std from ``sample`` (uint8 N,C,H,W) — used for grey sets
    (MNIST's 0.1307/0.3081 are exactly its training statistics).
    """
    if isinstance(normalize, dict):
        mean, std = tuple(normalize["mean"]), tuple(normalize["std"])
    elif normalize == "imagenet":
        mean, std = IMAGENET
    elif normalize == "half":
        mean, std = (0.5,) * channels, (0.5,) * channels
    elif normalize == "data":
        if sample is None:
            raise ConfigError("normalize='data' needs the training images in memory; use imagenet or half")
        x = sample.float() / 255.0
        mean = tuple(x.mean(dim=(0, 2, 3)).tolist())
        std = tuple(x.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist())
    else:
        raise ConfigError(f"normalize={normalize!r}; valid: imagenet, half, data, or {{mean: [...], std: [...]}}")
    if len(mean) != channels or len(std) != channels:
        raise ConfigError(f"normalize: mean/std need {channels} values for dataset {dataset_name!r}")
    return InputPipeline(mean=mean, std=std, augmentation=augmentation)
