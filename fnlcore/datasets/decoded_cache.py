"""Decoded image caches: an on-disk set's images decoded once, at the size training reads them.

Decoding a PNG or JPEG and resizing it every epoch costs one CPU core per few
hundred images a second (benchmarks/README.md, "Loader throughput"), less than a
GPU consumes at paper scale. The remedy: decode each split once into one uint8
array (N, C, H, W) at exactly the size the loader hands to training (the
network's input, or the larger resize that the device then crops), stored as a
``.npy`` file that training memory-maps (nothing is loaded whole).

Files, per prepared dataset ``results/data/<name>``::

    decoded/<split>-c<C>-<H>x<W>[-short<S>].npy    the pixels, row i = sample i of the split
    decoded/<split>-c<C>-<H>x<W>[-short<S>].json   what they were decoded from (written LAST:
                                                    its presence means the cache is complete)

The pixels are those of ``fnlcore.imagefiles.ImageFiles`` for the same geometry,
byte for byte (the cache is built by it). The JSON's fingerprint (the image paths,
in order, and the geometry) guards against a cache of another preparation.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import json

import numpy as np

from ..errors import ConfigError, DataError, StorageError
from ..io import atomic_path, ensure_free_space, write_json
from ..image_transforms import image_loading
from .base import get_dataset, load_prepared, META_FILE
from .rawfiles import image_size_setting

__all__ = [
    "CACHE_DIR",
    "RULE_FILES",
    "CacheGeometry",
    "build_decoded_cache",
    "cache_enabled",
    "cache_files",
    "cache_geometries",
    "find_decoded_cache",
    "planned_cache_files",
]

CACHE_DIR = "decoded"
# the files of one split's cache under a prepared dataset's folder, as the workflow's rule names them
RULE_FILES = {"pixels": f"/{CACHE_DIR}/{{split}}-{{geometry}}.npy", "done": f"/{CACHE_DIR}/{{split}}-{{geometry}}.json"}
OPTION = "decoded_cache"  # the dataset option that switches the cache (on-disk sets; default true)
_NAME = re.compile(r"^c(?P<c>[13])-(?P<h>\d+)x(?P<w>\d+)(?:-short(?P<s>\d+))?$")


@dataclass(frozen=True)
class CacheGeometry:
    """What the loader makes of each file: ``channels``, output (H, W), and the optional shorter
    side resized first (then the central (H, W) cut), as ``ImageFiles`` takes them."""

    channels: int
    size: tuple[int, int]
    short_side: int | None = None

    @property
    def name(self) -> str:
        h, w = self.size
        return f"c{self.channels}-{h}x{w}" + ("" if self.short_side is None else f"-short{self.short_side}")

    @classmethod
    def parse(cls, name: str) -> CacheGeometry:
        m = _NAME.match(name)
        if m is None:
            raise ConfigError(f"decoded cache geometry {name!r} is not c<1|3>-<H>x<W>[-short<S>] (e.g. c3-224x224)")
        short = m.group("s")
        return cls(int(m.group("c")), (int(m.group("h")), int(m.group("w"))), None if short is None else int(short))

    def nbytes(self, n: int) -> int:
        return n * self.channels * self.size[0] * self.size[1]


def cache_geometries(channels: int, image_size: tuple[int, int], image_transform: str) -> dict[str, CacheGeometry]:
    """split -> the geometry training reads it at, for ``training.image_transform`` (as
    ``fnlcore.app.train.load_federated_data`` builds its loaders)."""

    load = image_loading(image_transform, tuple(image_size))
    return {
        "train": CacheGeometry(int(channels), tuple(load.train_size)),
        "test": CacheGeometry(int(channels), tuple(load.test_size), load.test_short_side),
    }


def cache_enabled(options: dict[str, Any] | None) -> bool:
    """The dataset option ``decoded_cache`` (default true: measured faster for every on-disk format)."""
    value = (options or {}).get(OPTION, True)
    if not isinstance(value, bool):
        raise ConfigError(f"dataset option {OPTION} must be true or false, got {value!r}")
    return value


def planned_cache_files(data_dir: str | Path, dataset: str, options: dict[str, Any] | None, image_transform: str) -> list[str]:
    """The cache files a training run of ``dataset`` under ``image_transform`` reads (the workflow's
    train jobs ask for them): none for in-memory sets or with the option ``decoded_cache: false``.

    The network size is the prepared artifact's where it exists (ICH records its files' own size),
    else the option ``image_size``, else the registry's."""


    info = get_dataset(dataset)
    if info.in_memory or not cache_enabled(options):
        return []
    meta = Path(data_dir) / META_FILE
    if meta.is_file():
        try:
            size = tuple(json.loads(meta.read_text())["image_size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{meta}: cannot read the prepared dataset's image size ({type(exc).__name__}: {exc}); "
                            "prepare the dataset again (delete the file and rerun)") from None
    else:
        size = image_size_setting((options or {}).get("image_size")) or info.image_size
    files = []
    for split, geometry in cache_geometries(info.channels, size, image_transform).items():
        files.extend(str(f) for f in cache_files(data_dir, split, geometry))
    return files


def cache_files(data_dir: str | Path, split: str, geometry: CacheGeometry) -> tuple[Path, Path]:
    """(pixels .npy, completion .json) of one split's cache in a prepared dataset's folder."""
    stem = Path(data_dir) / CACHE_DIR / f"{split}-{geometry.name}"
    return stem.with_suffix(".npy"), stem.with_suffix(".json")


def _fingerprint(paths: Sequence[str], geometry: CacheGeometry) -> str:
    digest = hashlib.sha256(geometry.name.encode())
    for p in paths:
        digest.update(b"\0" + str(p).encode())
    return digest.hexdigest()


def build_decoded_cache(
    data_dir: str | Path, split: str, geometry: CacheGeometry, workers: int = 0, batch_size: int = 256
) -> Path:
    """Decode every image of ``split`` once into the cache files (atomically); returns the .npy path.

    The array is written through ``np.lib.format.open_memmap`` under a temporary name, so memory
    stays at one batch whatever the split's size; it is renamed onto its place when complete,
    and the JSON follows it."""
    # lazy: torch only where a cache is built; fnlcore.datasets imports without it (envs/labels.yaml)
    from torch.utils.data import DataLoader

    from ..imagefiles import ImageFiles  # lazy: as above (ImageFiles is a torch Dataset)

    ds = load_prepared(data_dir)
    if ds.meta["in_memory"]:
        raise DataError(f"dataset {ds.meta['name']!r} lives in memory already; a decoded cache is for on-disk sets")
    paths = [str(p) for p in ds.paths(split)]
    if not paths:
        raise DataError(f"dataset {ds.meta['name']!r}: split {split!r} is empty; nothing to cache")
    npy, done = cache_files(data_dir, split, geometry)
    done.unlink(missing_ok=True)  # an interrupted rebuild never leaves an old marker beside new pixels
    h, w = geometry.size
    shape = (len(paths), geometry.channels, h, w)
    try:
        ensure_free_space(npy.parent, geometry.nbytes(len(paths)), f"the decoded cache {npy.name}")
    except StorageError as err:
        raise StorageError(f"{err}; or set the dataset option {OPTION}: false (decode every epoch)") from None
    files = ImageFiles(paths, geometry.size, geometry.channels, geometry.short_side)
    loader = DataLoader(files, batch_size=batch_size, shuffle=False, num_workers=workers)
    with atomic_path(npy, suffix=".npy") as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        for x, index in loader:  # in order: the batch covers rows index[0] .. index[-1]
            out[int(index[0]) : int(index[-1]) + 1] = x.numpy()
        out.flush()
        del out
    write_json(
        {"split": split, "geometry": geometry.name, "shape": list(shape), "n": len(paths),
         "fingerprint": _fingerprint(paths, geometry), "dataset": ds.meta["name"]},
        done,
    )
    return npy


def find_decoded_cache(data_dir: str | Path, split: str, paths: Sequence[str], geometry: CacheGeometry) -> Path | None:
    """The complete cache of ``split`` at ``geometry`` for exactly ``paths``, or None when there is none.

    A cache of another preparation (other paths, order or shape) is a DataError naming the fix:
    training never reads pixels that are not the files'."""
    npy, done = cache_files(data_dir, split, geometry)
    if not done.is_file():
        return None

    try:
        record = json.loads(done.read_text())
        header_shape = _npy_shape(npy)
    except (OSError, ValueError) as exc:
        raise DataError(f"decoded cache {npy} cannot be read ({exc}); delete {done} and {npy} and rerun") from None
    want = [len(paths), geometry.channels, *geometry.size]
    if record.get("fingerprint") != _fingerprint(paths, geometry) or list(header_shape) != want:
        raise DataError(
            f"decoded cache {npy} was built from another preparation of the dataset (shape {list(header_shape)}, "
            f"this run reads {want} from its image files); delete {done} and {npy}, and rerun (the workflow rebuilds it)"
        )
    return npy


def _npy_shape(path: Path) -> tuple[int, ...]:
    pixels = np.load(path, mmap_mode="r")  # reads the header only
    if pixels.dtype != np.uint8:
        raise ValueError(f"dtype {pixels.dtype}, expected uint8")
    return tuple(pixels.shape)
