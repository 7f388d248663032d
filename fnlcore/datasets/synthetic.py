"""Synthetic stand-ins for the real datasets: the smoke scale's offline data.

For every real dataset ``B`` in :data:`SYNTHETIC_BASES` this module registers
``synthetic_<B>``: an in-memory set of the same shape as ``B`` (number of
classes, class names, channels, single- or multi-label, image size) whose
images are generated from a seed, so every table's workflow can run end to
end on a CPU without downloads (DESIGN.md "Scales").

How the data look (all uint8, (N, H, W, C); details in :class:`SyntheticStyle`):

- one random *prototype* per class (plus a 'background' prototype for
  multi-label rows without any positive class), made of a smooth layout
  (Gaussian fields on 4x4 and 8x8 grids, per channel, bilinearly upsampled to
  H x W), a colour offset per channel and a texture grating of class-specific
  orientation and period whose phase is drawn per sample;
- single-label: ``x = 128 + a * prototype[y] + b + noise`` with a per-sample
  amplitude ``a``, a per-sample brightness shift ``b`` and i.i.d. Gaussian
  pixel noise, rounded and clipped to 0..255;
- multi-label: the same with the *mean* of the prototypes of the positive
  classes (the background prototype when there are none).

The texture exists because the smoke-scale ``tiny`` CNN pools globally and
cannot read a fixed layout; with it, it learns these sets in a few epochs,
while a linear model still separates the classes by layout and colour.

Labels: single-label sets hold every class at least twice in each split (the
rest drawn uniformly), so a split needs ``n >= 2 * num_classes``;
multi-label sets draw a prevalence in [0.1, 0.4] per class (shared by both
splits) and make sure each class has at least one positive and one negative
in each split.

Randomness: no official generator exists, so numpy's ``Generator`` (PCG64)
is used for its float32 normal draws; independent streams
``default_rng([seed, 0])`` (prototypes, prevalences), ``[seed, 1]`` (train)
and ``[seed, 2]`` (test) make the test split independent of ``n_train``.
Generation is vectorised and works in bounded-size chunks of samples, whose
size does not change the result.

Options (dataset config): ``n_train`` (int, 400), ``n_test`` (int, 200),
``seed`` (int, 0) and ``image_size`` (``[H, W]``; default ``B``'s size).
Large images cost memory: 400 x 512x512x3 uint8 is 315 MB for the train split
alone (``synthetic_ich_fednoro`` at its default size), so the smoke scale
should ask for a small ``image_size``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from ..errors import ConfigError
from . import chestxray, cifar, clothing1m, ich, isic, mnist  # noqa: F401  (register the real datasets first)
from .base import DATASETS, DataShape, DatasetInfo, PrepareContext, validate_options, write_prepared

__all__ = [
    "SYNTHETIC_BASES",
    "SYNTHETIC",
    "OPTIONS",
    "SyntheticStyle",
    "SyntheticSpec",
    "SyntheticData",
    "Prototypes",
    "synthetic_name",
    "spec_from_options",
    "class_prototypes",
    "single_labels",
    "multi_labels",
    "render_images",
    "generate",
]

#: The real datasets that get a ``synthetic_<name>`` stand-in.
SYNTHETIC_BASES: tuple[str, ...] = (
    "mnist",
    "fmnist",
    "cifar10",
    "cifar100",
    "isic2019",
    "ich_fednoro",
    "ich_fedmlp",
    "chestxray14",
    "clothing1m",
)

#: Option defaults; ``image_size: None`` means the real dataset's size.
OPTIONS: dict[str, Any] = {"n_train": 400, "n_test": 200, "seed": 0, "image_size": None}

#: Minimum samples per class in each split of a single-label set.
MIN_PER_CLASS = 2
#: Prevalence range of each class of a multi-label set.
PREVALENCE_RANGE = (0.1, 0.4)
#: float32 values processed per chunk (bounds the memory used while rendering).
CHUNK_VALUES = 1 << 22

_STREAM_PROTOTYPES, _STREAM_TRAIN, _STREAM_TEST = 0, 1, 2


@dataclass(frozen=True)
class SyntheticStyle:
    """How the images look and how hard they are (pixel units, 0..255 scale).

    A class prototype has three parts: a smooth *layout* (Gaussian fields on
    the coarse ``grids``, weighted by ``octave_weights``, upsampled; pixel std
    ``layout_contrast``), a constant *colour* offset per channel (std
    ``color_contrast``) and a *texture*: a plane-wave grating of class-specific
    orientation, period (uniform in ``texture_period`` pixels) and channel
    mix (amplitude ``texture_contrast``) whose phase is drawn per sample, so
    it is a local pattern rather than a fixed layout. A small CNN with global
    pooling reads colour and texture; a linear model reads layout and colour.
    Per sample: amplitude uniform in ``amplitude``, brightness shift with std
    ``brightness_std``, i.i.d. pixel noise with std ``noise_std``.
    """

    layout_contrast: float = 32.0
    color_contrast: float = 24.0
    texture_contrast: float = 48.0
    texture_period: tuple[float, float] = (3.0, 8.0)
    noise_std: float = 40.0
    amplitude: tuple[float, float] = (0.6, 1.4)
    brightness_std: float = 8.0
    grids: tuple[int, ...] = (4, 8)
    octave_weights: tuple[float, ...] = (1.0, 0.5)

    def __post_init__(self) -> None:
        if len(self.grids) != len(self.octave_weights) or not self.grids or min(self.grids) < 1:
            raise ConfigError(f"SyntheticStyle: grids {self.grids} and octave_weights {self.octave_weights} "
                              "must be non-empty, of equal length, grids >= 1")
        for key in ("amplitude", "texture_period"):
            low, high = getattr(self, key)
            if not 0 <= low <= high:
                raise ConfigError(f"SyntheticStyle: {key} must be (low, high) with 0 <= low <= high, got {(low, high)}")
        if min(self.layout_contrast, self.color_contrast, self.texture_contrast, self.noise_std,
               self.brightness_std) < 0:
            raise ConfigError("SyntheticStyle: contrasts, noise_std and brightness_std must be >= 0")
        if self.texture_period[0] <= 0:
            raise ConfigError("SyntheticStyle: texture_period must be > 0 pixels")


DEFAULT_STYLE = SyntheticStyle()


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape, sizes and seed of one synthetic set (what :func:`generate` needs)."""

    num_classes: int
    channels: int
    image_size: tuple[int, int]
    multi_label: bool
    n_train: int = 400
    n_test: int = 200
    seed: int = 0
    name: str = "synthetic"

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", tuple(int(s) for s in self.image_size))
        where = f"dataset {self.name!r}"
        if self.num_classes < 1 or self.channels < 1:
            raise ConfigError(f"{where}: num_classes and channels must be >= 1")
        if len(self.image_size) != 2 or min(self.image_size) < 1:
            raise ConfigError(f"{where}: option image_size must be [H, W] with H, W >= 1, got {list(self.image_size)}")
        if self.seed < 0:
            raise ConfigError(f"{where}: option seed must be >= 0, got {self.seed}. Fix: use a non-negative seed.")
        need = 2 if self.multi_label else MIN_PER_CLASS * self.num_classes
        why = ("one positive and one negative per class" if self.multi_label
               else f"{MIN_PER_CLASS} samples per class x num_classes={self.num_classes}")
        for key in ("n_train", "n_test"):
            n = getattr(self, key)
            if n < need:
                raise ConfigError(
                    f"{where}: option {key}={n} is too small; each split needs at least {need} samples "
                    f"({why}). Fix: set {key} >= {need}."
                )


@dataclass(frozen=True)
class SyntheticData:
    """Generated arrays: uint8 images (N, H, W, C); int64 labels (N,) or uint8 (N, K)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    prevalence: np.ndarray | None = None  # multi-label only: the per-class prevalences drawn


def synthetic_name(base: str) -> str:
    """``synthetic_<base>``: the registered name of a real dataset's stand-in."""
    return f"synthetic_{base}"


def _interpolation_matrix(size: int, grid: int) -> np.ndarray:
    """(size, grid) bilinear weights mapping grid cell centres to pixel centres (edges clamped)."""
    t = np.clip((np.arange(size) + 0.5) * grid / size - 0.5, 0.0, grid - 1)
    lo = np.floor(t).astype(np.int64)
    hi = np.minimum(lo + 1, grid - 1)
    frac = t - lo
    m = np.zeros((size, grid))
    np.add.at(m, (np.arange(size), lo), 1.0 - frac)
    np.add.at(m, (np.arange(size), hi), frac)
    return m


@dataclass(frozen=True)
class Prototypes:
    """Per-class image parts, float32 (P, H, W, C) in pixel units (see :class:`SyntheticStyle`).

    A sample of class k with texture phase phi is
    ``static[k] + cos(phi) * texture_cos[k] - sin(phi) * texture_sin[k]``.
    """

    static: np.ndarray
    texture_cos: np.ndarray
    texture_sin: np.ndarray

    def __len__(self) -> int:
        return len(self.static)


def class_prototypes(
    count: int,
    channels: int,
    image_size: tuple[int, int],
    rng: np.random.Generator,
    style: SyntheticStyle = DEFAULT_STYLE,
) -> Prototypes:
    """``count`` random class prototypes: smooth layout + colour offset + texture grating.

    Draws, in order: the layout fields (one standard-normal (count, g, g, C)
    array per grid), colours (count, C), texture orientations (count),
    periods (count) and channel mixes (count, C).
    """
    h, w = image_size
    layout = np.zeros((count, h, w, channels))
    for grid, weight in zip(style.grids, style.octave_weights):
        gh, gw = min(grid, h), min(grid, w)
        field = rng.standard_normal((count, gh, gw, channels))
        layout += weight * np.einsum("hi,kijc,wj->khwc", _interpolation_matrix(h, gh), field,
                                     _interpolation_matrix(w, gw), optimize=True)
    layout_std = layout.std()
    layout *= style.layout_contrast / (layout_std if layout_std > 0 else 1.0)
    color = rng.standard_normal((count, channels)) * style.color_contrast
    angle = rng.uniform(0.0, np.pi, size=count)
    period = rng.uniform(*style.texture_period, size=count)
    mix = rng.standard_normal((count, channels))
    mix *= np.sqrt(channels) / np.maximum(np.linalg.norm(mix, axis=1, keepdims=True), 1e-12)

    rows, cols = np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64)
    freq = 2.0 * np.pi / period
    wave = ((freq * np.cos(angle))[:, None, None] * cols[None, None, :]
            + (freq * np.sin(angle))[:, None, None] * rows[None, :, None])
    scale = np.sqrt(2.0) * style.texture_contrast * mix[:, None, None, :]  # a grating's std is 1/sqrt(2)
    return Prototypes(
        static=(layout + color[:, None, None, :]).astype(np.float32),
        texture_cos=(np.cos(wave)[..., None] * scale).astype(np.float32),
        texture_sin=(np.sin(wave)[..., None] * scale).astype(np.float32),
    )


def single_labels(n: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """int64 (n,): every class ``MIN_PER_CLASS`` times, the rest uniform, in random order."""
    fixed = np.tile(np.arange(num_classes, dtype=np.int64), MIN_PER_CLASS)
    rest = rng.integers(0, num_classes, size=n - len(fixed), dtype=np.int64)
    return rng.permutation(np.concatenate([fixed, rest]))


def multi_labels(n: int, prevalence: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """uint8 (n, K): class k positive with probability ``prevalence[k]``; >= 1 positive and negative each.

    A class left without positives gets one at a random row; one left without
    negatives gets one at another random row (two draws per class, always made).
    """
    k = len(prevalence)
    y = (rng.random((n, k)) < prevalence).astype(np.uint8)
    pos_row = rng.integers(0, n, size=k)
    neg_row = (pos_row + 1 + rng.integers(0, n - 1, size=k)) % n  # differs from pos_row
    cols = np.flatnonzero(y.sum(0) == 0)
    y[pos_row[cols], cols] = 1
    cols = np.flatnonzero(y.sum(0) == n)
    y[neg_row[cols], cols] = 0
    return y


def render_images(
    prototypes: Prototypes,
    labels: np.ndarray,
    multi_label: bool,
    rng: np.random.Generator,
    style: SyntheticStyle = DEFAULT_STYLE,
    chunk_values: int = CHUNK_VALUES,
) -> np.ndarray:
    """uint8 (n, H, W, C) images of ``labels`` from ``prototypes`` (see the module docstring).

    Single-label sets need K prototypes, multi-label sets K + 1 (the last is
    the background, used by rows without positives; other rows average their
    positive classes). Draws: amplitudes, brightness shifts and texture phases
    (n each), then the pixel noise sample by sample in order, so
    ``chunk_values`` (values per chunk, i.e. memory) does not change the result.
    """
    n = len(labels)
    shape = prototypes.static.shape[1:]
    pixels = int(np.prod(shape))
    amp = rng.uniform(*style.amplitude, size=n).astype(np.float32)
    shift = (rng.standard_normal(n) * style.brightness_std + 128.0).astype(np.float32)
    phase = rng.uniform(0.0, 2.0 * np.pi, size=n)
    cos_phase, sin_phase = np.cos(phase).astype(np.float32), np.sin(phase).astype(np.float32)
    static, tex_cos, tex_sin = (a.reshape(len(prototypes), pixels)
                                for a in (prototypes.static, prototypes.texture_cos, prototypes.texture_sin))
    out = np.empty((n, pixels), dtype=np.uint8)
    rows = max(1, chunk_values // pixels)
    for start in range(0, n, rows):
        part = slice(start, min(n, start + rows))
        if multi_label:
            y = labels[part].astype(np.float32)
            count = y.sum(1, keepdims=True)
            weights = np.concatenate([y, (count == 0).astype(np.float32)], axis=1) / np.maximum(count, 1.0)
            x, c, s = weights @ static, weights @ tex_cos, weights @ tex_sin
        else:
            x, c, s = static[labels[part]], tex_cos[labels[part]], tex_sin[labels[part]]
        c *= cos_phase[part, None]
        s *= sin_phase[part, None]
        x += c
        x -= s
        del c, s
        x *= amp[part, None]
        x += shift[part, None]
        noise = rng.standard_normal(x.shape, dtype=np.float32)
        noise *= np.float32(style.noise_std)
        x += noise
        np.rint(x, out=x)
        np.clip(x, 0, 255, out=x)
        out[part] = x
    return out.reshape(n, *shape)


def generate(spec: SyntheticSpec, style: SyntheticStyle = DEFAULT_STYLE) -> SyntheticData:
    """Generate both splits of a synthetic set (deterministic in ``spec.seed``; see the module docstring)."""
    k = spec.num_classes
    proto_rng = np.random.default_rng([spec.seed, _STREAM_PROTOTYPES])
    protos = class_prototypes(k + 1 if spec.multi_label else k, spec.channels, spec.image_size, proto_rng, style)
    prevalence = proto_rng.uniform(*PREVALENCE_RANGE, size=k) if spec.multi_label else None

    def split(n: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([spec.seed, stream])
        y = multi_labels(n, prevalence, rng) if spec.multi_label else single_labels(n, k, rng)
        return render_images(protos, y, spec.multi_label, rng, style), y

    x_train, y_train = split(spec.n_train, _STREAM_TRAIN)
    x_test, y_test = split(spec.n_test, _STREAM_TEST)
    return SyntheticData(x_train, y_train, x_test, y_test, prevalence)


def _image_size_option(name: str, value: Any, default: tuple[int, int]) -> tuple[int, int]:
    if value is None:
        return default
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    )
    if not ok:
        raise ConfigError(
            f"dataset {name!r}: option 'image_size' must be a list [H, W] of two positive integers, "
            f"got {value!r}. Fix: e.g. image_size: [32, 32]."
        )
    return (int(value[0]), int(value[1]))


def spec_from_options(info: DatasetInfo, options: Mapping[str, Any] | None) -> SyntheticSpec:
    """The :class:`SyntheticSpec` of a registered stand-in ``info`` under config ``options``.

    Unknown keys, wrong types, a bad ``image_size`` or too few samples per
    split are ConfigErrors naming the option.
    """
    opts = validate_options(info.name, options, OPTIONS)
    return SyntheticSpec(
        num_classes=info.num_classes,
        channels=info.channels,
        image_size=_image_size_option(info.name, opts["image_size"], info.image_size),
        multi_label=info.multi_label,
        n_train=opts["n_train"],
        n_test=opts["n_test"],
        seed=opts["seed"],
        name=info.name,
    )


def _index(y_train: np.ndarray, y_test: np.ndarray, multi_label: bool) -> pd.DataFrame:
    n_train, n_test = len(y_train), len(y_test)
    columns: dict[str, Any] = {
        "sample_id": np.concatenate([np.arange(n_train), np.arange(n_test)]).astype(np.int64),
        "split": np.array(["train"] * n_train + ["test"] * n_test, dtype=object),
    }
    y = np.concatenate([y_train, y_test])
    if multi_label:
        columns.update({f"label_{j}": y[:, j] for j in range(y.shape[1])})
    else:
        columns["label"] = y
    return pd.DataFrame(columns)


def _make_prepare(base: str) -> Callable[[PrepareContext], None]:
    name = synthetic_name(base)

    def prepare(ctx: PrepareContext) -> None:
        """Generate and write the stand-in artifact (in memory, no download)."""
        info = SYNTHETIC[name]
        spec = spec_from_options(info, ctx.options)
        data = generate(spec)
        if spec.image_size != info.image_size:
            info = replace(info, image_size=spec.image_size)
        extra: dict[str, Any] = {
            "stand_in_for": base,
            "options": {"n_train": spec.n_train, "n_test": spec.n_test, "seed": spec.seed,
                        "image_size": list(spec.image_size)},
            "generator": "fnlcore.datasets.synthetic (numpy PCG64 streams [seed, 0|1|2])",
            "style": asdict(DEFAULT_STYLE),
            "numpy_version": np.__version__,
        }
        if data.prevalence is not None:
            extra["prevalence"] = [float(p) for p in data.prevalence]
        write_prepared(
            ctx.out_dir,
            info,
            _index(data.y_train, data.y_test, spec.multi_label),
            {"x_train": data.x_train, "x_test": data.x_test},
            extra_meta=extra,
            raw_dir=ctx.raw_dir,
        )

    prepare.__qualname__ = f"prepare_{name}"
    prepare.__name__ = f"prepare_{name}"
    return prepare


def _shape_for(name: str) -> Callable[[Mapping[str, Any]], DataShape]:
    def shape(options: Mapping[str, Any]) -> DataShape:
        s = spec_from_options(SYNTHETIC[name], options)
        return DataShape(s.n_train, s.n_test, s.channels, s.image_size, s.num_classes, s.multi_label)

    return shape


def _stand_in_info(base: str) -> DatasetInfo:
    real = DATASETS[base]
    return DatasetInfo(
        name=synthetic_name(base),
        num_classes=real.num_classes,
        class_names=real.class_names,
        multi_label=real.multi_label,
        channels=real.channels,
        image_size=real.image_size,
        in_memory=True,
        source=f"synthetic stand-in for {base} (smoke scale)",
        papers=real.papers,
        prepare=_make_prepare(base),
        augmentation=real.augmentation,
        shape_for=_shape_for(synthetic_name(base)),
    )


#: ``synthetic_<base>`` -> its registered DatasetInfo.
SYNTHETIC: dict[str, DatasetInfo] = {synthetic_name(b): DATASETS.register(_stand_in_info(b)) for b in SYNTHETIC_BASES}
