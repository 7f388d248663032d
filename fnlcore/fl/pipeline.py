"""Turn uint8 image batches into normalised float batches, with batched training augmentation."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .. import augment
from ..errors import ConfigError
from ..image_transforms import ImageLoading
from ..randaugment import RandAugmentSpec, apply_rand_augment, draw_rand_augment
from ..syncs import host_side

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

# Training augmentations used by the papers (on tensors, see fnlcore.augment):
#   crop_flip   RandomCrop(size, padding=4) + RandomHorizontalFlip   (FedCorr, FedDiv, FedGR weak view)
#   affine_flip RandomAffine(10, translate=(0.02, 0.02)) + RandomHorizontalFlip  (FedNoRo, FedMLP)
#   none        (Fed-NCL, digits)
AUGMENTATIONS = ("none", "crop_flip", "affine_flip")
# With ``crop_size`` set, training batches arrive larger than the network input (``input_size``,
# e.g. Clothing1M's 256 x 256 resize, image_transform resize_crop*): crop_flip is then
# RandomCrop(crop_size, padding=crop_padding) of them (the papers: no padding), every other
# augmentation starts from their CenterCrop(crop_size), and the eval view centre-crops any
# batch larger than crop_size (test batches arrive at crop_size already).
# The strong view's crop (``strong_crop``): 'train' = the train augmentation's own crop (its
# padding by ``strong_padding``); 'resized' = RandomResizedCrop(crop_size) of the input + flip
# (FedGR's Clothing1M strong view, fedgr.md §4).
STRONG_CROPS = ("train", "resized")
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
    crop_size: tuple[int, int] | None = None  # the network input cut from larger training batches
    input_size: tuple[int, int] | None = None  # the size training batches arrive at (with crop_size)
    strong_crop: str = "train"  # train | resized (see STRONG_CROPS)

    def __post_init__(self) -> None:
        if self.augmentation not in AUGMENTATIONS:
            raise ConfigError(f"augmentation={self.augmentation!r}; valid: {', '.join(AUGMENTATIONS)}")
        if self.strong_padding not in augment.PADDING_MODES:
            raise ConfigError(f"strong_padding={self.strong_padding!r}; valid: {', '.join(augment.PADDING_MODES)}")
        if self.strong_crop not in STRONG_CROPS:
            raise ConfigError(f"strong_crop={self.strong_crop!r}; valid: {', '.join(STRONG_CROPS)}")
        if (self.crop_size is None) != (self.input_size is None):
            raise ConfigError("crop_size and input_size come together (training batches larger than the network input)")
        if self.crop_size is not None:
            crop, full = tuple(int(v) for v in self.crop_size), tuple(int(v) for v in self.input_size)
            object.__setattr__(self, "crop_size", crop)
            object.__setattr__(self, "input_size", full)
            if crop[0] > full[0] + 2 * self.crop_padding or crop[1] > full[1] + 2 * self.crop_padding:
                raise ConfigError(f"crop_size {crop} larger than the training images {full}")

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
        """Normalise; a batch larger than ``crop_size`` (training images) is centre-cropped first."""
        return self._norm(self._center(x))

    def _center(self, x: torch.Tensor) -> torch.Tensor:
        if self.crop_size is None or tuple(x.shape[-2:]) == self.crop_size:
            return x
        return augment.center_crop(x, self.crop_size)

    def _slack(self) -> tuple[int, int]:
        """Input minus crop size per axis: the extra range of crop offsets."""
        if self.crop_size is None:
            return (0, 0)
        return (self.input_size[0] - self.crop_size[0], self.input_size[1] - self.crop_size[1])

    def draw_train(self, n: int, gen: torch.Generator | None, device, size: tuple[int, int] | None = None) -> tuple:
        """The random parameters ``train`` draws for a batch of ``n`` images of ``size`` (h, w; default
        the training image size), in the same order from ``gen``.

        ``apply_train(x, draw_train(len(x), gen, x.device))`` equals ``train(x, gen)``, and leaves
        ``gen`` in the same state: the batched-clients engine draws every client's batches in
        the sequential engine's order, then augments all clients at once.
        """
        return self._draw_geometric(n, gen, device, tuple(size) if size is not None else None)

    def apply_train(self, x: torch.Tensor, params: tuple) -> torch.Tensor:
        """``train`` with parameters from :meth:`draw_train` (concatenated along samples for several batches)."""
        return self._norm(self._apply_geometric(x, params))

    def view(self, name: str, x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """One named view (see VIEWS) of a uint8 batch, normalised."""
        return self.apply_view(name, x, self.draw_view(name, x.shape[0], gen, x.device, tuple(x.shape[-2:])))

    def draw_view(self, name: str, n: int, gen: torch.Generator | None, device, size: tuple[int, int]) -> tuple:
        """The random parameters of view ``name`` for ``n`` images of ``size`` (h, w), in :meth:`view`'s order.

        ``apply_view(name, x, draw_view(name, len(x), gen, ...))`` equals ``view(name, x, gen)``: the
        batched-clients engine draws every client's views in the sequential order, then applies them
        to all clients at once."""
        if name == "eval":
            return ()
        if name == "weak":
            return self.draw_train(n, gen, device, size)
        if name == "strong":
            if self.strong_crop == "resized":
                out = self.crop_size or tuple(size)
                geo = (augment.draw_resized_crop(n, tuple(size), gen, device), augment.draw_flip(n, FLIP_P, gen, device))
            else:
                out = self.crop_size or tuple(size)  # every train augmentation ends at crop_size when set
                geo = self._draw_geometric(n, gen, device, tuple(size))
            return geo, draw_rand_augment(n, self.strong, gen, device, tuple(out))
        raise ConfigError(f"view {name!r}; valid views: {', '.join(VIEWS)}")

    def apply_view(self, name: str, x: torch.Tensor, params: tuple) -> torch.Tensor:
        """View ``name`` of a uint8 batch with parameters from :meth:`draw_view`."""
        if name == "eval":
            return self.eval(x)
        if name == "weak":
            return self.apply_train(x, params)
        if name == "strong":
            geo, ra = params
            if self.strong_crop == "resized":
                size = self.crop_size or tuple(x.shape[-2:])
                g = augment.flip_where(augment.resized_crop_at(x, geo[0], size), geo[1])
            else:
                g = self._apply_geometric(x, geo, self.strong_padding)
            return self._norm(apply_rand_augment(g, self.strong, ra))
        raise ConfigError(f"view {name!r}; valid views: {', '.join(VIEWS)}")

    def views(self, x: torch.Tensor, gen: torch.Generator | None, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Several views of the same batch, each drawn independently, batched on its device.

        A name may repeat with a suffix ('weak:1', 'weak:2') for independent draws of one view.
        """
        return {n: self.view(n.split(":", 1)[0], x, gen) for n in names}

    def _geometric(self, x: torch.Tensor, gen: torch.Generator | None, padding_mode: str = "constant") -> torch.Tensor:
        """The train augmentation without normalisation (uint8 in, uint8 out)."""
        params = self._draw_geometric(x.shape[0], gen, x.device, tuple(x.shape[-2:]))
        return self._apply_geometric(x, params, padding_mode)

    def _draw_geometric(self, n: int, gen: torch.Generator | None, device, size: tuple[int, int] | None) -> tuple:
        if gen is not None and gen.device.type == "cpu":  # draws from a host generator are host tensors
            with host_side():
                return self._draw_geometric_on(n, gen, device, size)
        return self._draw_geometric_on(n, gen, device, size)

    def _draw_geometric_on(self, n: int, gen: torch.Generator | None, device, size: tuple[int, int] | None) -> tuple:
        if self.augmentation == "crop_flip":
            size = size or self.input_size
            target = self.crop_size or size
            # RandomCrop without padding to the images' own size draws nothing (augment.random_crop)
            if size is not None and self.crop_padding <= 0 and tuple(target) == tuple(size):
                crop = ()
            else:
                slack = (size[0] - target[0], size[1] - target[1]) if size is not None else self._slack()
                crop = augment.draw_crop(n, self.crop_padding, gen, device, slack)
            return crop, augment.draw_flip(n, FLIP_P, gen, device)
        if self.augmentation == "affine_flip":
            return (augment.draw_affine(n, AFFINE_DEGREES, AFFINE_TRANSLATE, gen, device),
                    augment.draw_flip(n, FLIP_P, gen, device))
        return ()

    def _apply_geometric(self, x: torch.Tensor, params: tuple, padding_mode: str = "constant") -> torch.Tensor:
        if self.augmentation == "crop_flip":
            crop, flip = params
            if crop:
                x = augment.crop_at(x, self.crop_padding, crop, padding_mode, self.crop_size or tuple(x.shape[-2:]))
            return augment.flip_where(x, flip)
        x = self._center(x)
        if self.augmentation == "affine_flip":
            return augment.flip_where(augment.affine_at(x, params[0]), params[1])
        return x


@lru_cache(maxsize=64)
def _channel_stats(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """(C, 1, 1) float32 mean and std on ``device``, built once per (values, device)."""
    return tuple(torch.tensor(v, dtype=torch.float32).to(device, non_blocking=True)[:, None, None] for v in (mean, std))


def make_pipeline(
    normalize: str | dict,
    augmentation: str,
    channels: int,
    dataset_name: str,
    sample: torch.Tensor | None = None,
    loading: ImageLoading | None = None,
) -> InputPipeline:
    """Build the pipeline; ``normalize`` is imagenet | half | data | {mean: [...], std: [...]}.

    ``loading``: how file-streamed images are read (None: at the network size). Where training
    images arrive larger than the network input, crop_flip is RandomCrop(input) without padding
    (FedCorr's RandomCrop(224) of the 256 x 256 resize) and the eval view centre-crops them.

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
    if loading is not None and loading.crops:
        return InputPipeline(mean=mean, std=std, augmentation=augmentation, crop_padding=0,
                             crop_size=loading.test_size, input_size=loading.train_size)
    return InputPipeline(mean=mean, std=std, augmentation=augmentation)
