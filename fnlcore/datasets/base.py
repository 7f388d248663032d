"""The dataset registry and the prepared-dataset artifact.

Every dataset module describes itself with a :class:`DatasetInfo` and calls
``DATASETS.register`` at import time. ``prepare_dataset`` runs a dataset's
``prepare`` step, which turns raw upstream files into one artifact folder
(``results/data/<name>``) through :func:`write_prepared`:

- ``index.parquet``: ``sample_id`` (int64, position within its split), ``split``
  (``"train"``/``"test"``), then ``label`` (int64) or ``label_0..label_{C-1}``
  (uint8, multi-label), then ``path`` (relative to the raw folder) for on-disk
  image sets; extra columns follow;
- ``arrays.npz`` (in-memory sets only): ``x_train``/``x_test``, uint8, (N, H, W, C);
- ``meta.json``, written LAST: its presence means the artifact is complete.

:func:`load_prepared` reads the artifact back as a :class:`PreparedDataset`.
"""

from __future__ import annotations

import dataclasses

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..registry import Registry
from ..errors import ConfigError, DataError
from ..io import read_parquet, write_json, write_npz, write_parquet
from . import download

__all__ = [
    "SPLITS",
    "DatasetInfo",
    "PrepareContext",
    "PreparedDataset",
    "DATASETS",
    "get_dataset",
    "prepare_dataset",
    "validate_options",
    "write_prepared",
    "load_prepared",
    "label_columns",
]

SPLITS: tuple[str, ...] = ("train", "test")
INDEX_FILE = "index.parquet"
ARRAYS_FILE = "arrays.npz"
META_FILE = "meta.json"


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset is and how to prepare it (one registry entry).

    ``image_size`` is the (H, W) the network sees; ``in_memory`` sets store
    uint8 arrays in ``arrays.npz``, the others keep image files on disk and
    list them in the index's ``path`` column. ``manual`` sets need an account
    or a request: the user places their files in the raw folder by hand.
    """

    name: str
    num_classes: int
    class_names: tuple[str, ...]
    multi_label: bool
    channels: int
    image_size: tuple[int, int]
    in_memory: bool
    source: str
    papers: tuple[str, ...]
    prepare: Callable[["PrepareContext"], None]
    manual: bool = False
    # Training augmentation its papers use ('' = by image size: affine+flip above 32 px, else none)
    augmentation: str = ""
    # (train, test) sample counts of the prepared set, for cost estimates before any download
    # (`fnl plan`); ``shape_for`` replaces them where options change the shape (synthetic sets).
    split_sizes: tuple[int, int] | None = None
    shape_for: Callable[[Mapping[str, Any]], "DataShape"] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_names", tuple(str(c) for c in self.class_names))
        object.__setattr__(self, "papers", tuple(self.papers))
        object.__setattr__(self, "image_size", tuple(int(s) for s in self.image_size))
        if len(self.class_names) != self.num_classes:
            raise ValueError(
                f"DatasetInfo({self.name!r}): {len(self.class_names)} class names for num_classes={self.num_classes}"
            )
        if self.channels not in (1, 3):
            raise ValueError(f"DatasetInfo({self.name!r}): channels must be 1 or 3, got {self.channels}")
        if len(self.image_size) != 2 or min(self.image_size) <= 0:
            raise ValueError(f"DatasetInfo({self.name!r}): image_size must be (H, W) > 0, got {self.image_size}")


@dataclass(frozen=True)
class DataShape:
    """What the cost model needs of a prepared set, known before it is prepared."""

    n_train: int
    n_test: int
    channels: int
    image_size: tuple[int, int]
    num_classes: int
    multi_label: bool


def expected_shape(info: DatasetInfo, options: Mapping[str, Any] | None = None) -> DataShape:
    """The shape ``info`` prepares to under ``options`` (its ``shape_for``, else ``split_sizes``)."""
    if info.shape_for is not None:
        return info.shape_for(options or {})
    if info.split_sizes is None:
        raise ConfigError(f"dataset {info.name!r} declares no split_sizes; add them to its DatasetInfo")
    n_train, n_test = info.split_sizes
    return DataShape(n_train, n_test, info.channels, tuple(info.image_size), info.num_classes, info.multi_label)


@dataclass(frozen=True)
class PrepareContext:
    """Where a ``prepare`` step reads raw files and writes its artifact, and with which options.

    ``raw_dir``: downloads and manually placed files of this dataset;
    ``out_dir``: the artifact folder; ``options``: the dataset's options from
    the config (the dataset validates them, see :func:`validate_options`);
    ``mirrors``: download mirror base URLs tried before the official URLs.
    """

    raw_dir: Path
    out_dir: Path
    options: Mapping[str, Any] = field(default_factory=dict)
    mirrors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "raw_dir", Path(self.raw_dir))
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options or {})))
        if isinstance(self.mirrors, str):
            raise ConfigError(f"mirrors must be a list of base URLs, got the string {self.mirrors!r}")
        object.__setattr__(self, "mirrors", tuple(str(m) for m in self.mirrors))

    def fetch(self, remote: download.RemoteFile, *, timeout: float = 60.0, progress: bool = False) -> Path:
        """Download (or reuse) ``remote`` into ``raw_dir`` through the configured mirrors."""
        return download.fetch(remote, self.raw_dir, self.mirrors, timeout=timeout, progress=progress)


#: name -> DatasetInfo; every module of fnlcore.datasets is imported on first use, so a
#: new dataset is one file that calls ``DATASETS.register(DatasetInfo(...))``.
DATASETS: Registry[DatasetInfo] = Registry("dataset", "fnlcore.datasets")


def get_dataset(name: str) -> DatasetInfo:
    """The registered dataset ``name``; an unknown name is a ConfigError listing the valid ones."""
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}. "
            "Fix: use one of these names for the dataset in the config."
        ) from None


def validate_options(dataset: str, options: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``options`` over ``defaults``; unknown keys or wrongly typed values are a ConfigError.

    A value must have the type of its default (an int is accepted for a float
    default; any value is accepted for a ``None`` default).
    """
    options = dict(options or {})
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        valid = ", ".join(sorted(defaults)) if defaults else "none (this dataset takes no options)"
        raise ConfigError(
            f"dataset {dataset!r}: unknown option(s) {', '.join(map(repr, unknown))}; valid options: {valid}. "
            "Fix: remove or rename them in the dataset's options."
        )
    merged = dict(defaults)
    for key, value in options.items():
        default = defaults[key]
        if default is not None and not _type_ok(value, default):
            raise ConfigError(
                f"dataset {dataset!r}: option {key!r} must be {type(default).__name__} "
                f"(default {default!r}), got {value!r}"
            )
        merged[key] = value
    return merged


def _type_ok(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def prepare_dataset(
    name: str,
    raw_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    options: Mapping[str, Any] | None = None,
    mirrors: Sequence[str] = (),
) -> None:
    """Prepare dataset ``name``: raw files in ``raw_dir`` -> artifact in ``out_dir``.

    Any previous ``meta.json`` is removed first, so an interrupted or failed
    run never leaves an artifact that looks complete.
    """
    info = get_dataset(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)
    ctx = PrepareContext(raw_dir=Path(raw_dir), out_dir=out, options=options or {}, mirrors=tuple(mirrors))
    if not info.manual:
        ctx.raw_dir.mkdir(parents=True, exist_ok=True)
    info.prepare(ctx)
    if not (out / META_FILE).is_file():
        raise DataError(f"dataset {name!r}: prepare finished without writing {out / META_FILE} (a bug in its module)")


def label_columns(info_or_meta: DatasetInfo | Mapping[str, Any]) -> list[str]:
    """``["label"]`` for single-label sets, ``["label_0", ..., "label_{C-1}"]`` for multi-label sets."""
    if isinstance(info_or_meta, DatasetInfo):
        multi, c = info_or_meta.multi_label, info_or_meta.num_classes
    else:
        multi, c = bool(info_or_meta["multi_label"]), int(info_or_meta["num_classes"])
    return [f"label_{j}" for j in range(c)] if multi else ["label"]


def write_prepared(
    out_dir: str | os.PathLike,
    info: DatasetInfo,
    index: pd.DataFrame,
    arrays: Mapping[str, np.ndarray] | None = None,
    extra_meta: Mapping[str, Any] | None = None,
    *,
    raw_dir: str | os.PathLike | None = None,
    files: Mapping[str, str] | None = None,
) -> None:
    """Validate and write the prepared artifact atomically (``meta.json`` last).

    ``index`` needs ``sample_id``, ``split``, the label column(s) and, for
    on-disk sets, ``path``; each split's ``sample_id`` must be 0..n-1. Rows
    are stored train first, each split in sample_id order. ``arrays`` holds
    ``x_train``/``x_test`` (uint8, (N, H, W, C)) for in-memory sets and must be
    empty otherwise. ``raw_dir`` (needed by on-disk sets to resolve paths) and
    ``files`` (file name -> ``"md5:<hex>"``) may also come in ``extra_meta``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)
    extra = dict(extra_meta or {})
    if raw_dir is None:
        raw_dir = extra.pop("raw_dir", None)
    if files is None:
        files = extra.pop("files", None)
    frame = _validated_index(info, index)
    n_train = int((frame["split"] == "train").sum())
    n_test = len(frame) - n_train
    arrays = dict(arrays or {})
    if info.in_memory:
        _check_arrays(info, arrays, {"train": n_train, "test": n_test})
    elif arrays:
        raise DataError(f"dataset {info.name!r} is an on-disk set; got arrays {sorted(arrays)} (expected none)")
    if not info.in_memory and raw_dir is None:
        raise DataError(f"dataset {info.name!r}: on-disk sets need raw_dir to resolve the index's paths")

    meta: dict[str, Any] = {
        "name": info.name,
        "num_classes": info.num_classes,
        "class_names": list(info.class_names),
        "multi_label": info.multi_label,
        "channels": info.channels,
        "image_size": list(info.image_size),
        "in_memory": info.in_memory,
        "n_train": n_train,
        "n_test": n_test,
        "source": info.source,
        "papers": list(info.papers),
        "raw_dir": str(Path(raw_dir).resolve()) if raw_dir is not None else None,
        "files": dict(files or {}),
    }
    clash = sorted(set(extra) & set(meta))
    if clash:
        raise DataError(f"dataset {info.name!r}: extra_meta must not override {clash}")
    meta.update(extra)

    write_parquet(frame, out / INDEX_FILE)
    if info.in_memory:
        write_npz(out / ARRAYS_FILE, x_train=arrays["x_train"], x_test=arrays["x_test"])
    else:
        (out / ARRAYS_FILE).unlink(missing_ok=True)
    write_json(meta, out / META_FILE)


def _validated_index(info: DatasetInfo, index: pd.DataFrame) -> pd.DataFrame:
    """Check the index against the contract (vectorised) and return it in canonical column/row order."""
    labels = label_columns(info)
    required = ["sample_id", "split", *labels] + ([] if info.in_memory else ["path"])
    missing = [c for c in required if c not in index.columns]
    if missing:
        raise DataError(f"dataset {info.name!r}: index lacks column(s) {missing} (has {list(index.columns)})")
    frame = index.reset_index(drop=True)
    split = frame["split"].astype(str)
    bad_split = sorted(set(split.unique()) - set(SPLITS))
    if bad_split:
        raise DataError(f"dataset {info.name!r}: split values must be 'train'/'test', found {bad_split}")
    if not pd.api.types.is_integer_dtype(frame["sample_id"]):
        raise DataError(f"dataset {info.name!r}: sample_id must be integers, got {frame['sample_id'].dtype}")
    order = np.lexsort((frame["sample_id"].to_numpy(), (split == "test").to_numpy()))
    frame = frame.iloc[order].reset_index(drop=True)
    split = split.iloc[order].reset_index(drop=True)
    sid = frame["sample_id"].to_numpy(np.int64)
    is_test = (split == "test").to_numpy()
    n_train = int((~is_test).sum())
    expected = np.concatenate([np.arange(n_train), np.arange(len(frame) - n_train)])
    if not np.array_equal(sid, expected):
        raise DataError(f"dataset {info.name!r}: sample_id must be 0..n-1 without gaps or repeats within each split")

    out = pd.DataFrame({"sample_id": sid, "split": split.to_numpy(dtype=object)})
    if info.multi_label:
        values = frame[labels].to_numpy()
        if not np.isin(values, (0, 1)).all():
            raise DataError(f"dataset {info.name!r}: multi-label columns must hold 0/1 only")
        for j, col in enumerate(labels):
            out[col] = values[:, j].astype(np.uint8)
    else:
        lab = frame["label"]
        if not pd.api.types.is_integer_dtype(lab):
            raise DataError(f"dataset {info.name!r}: label must be integers, got {lab.dtype}")
        lab = lab.to_numpy(np.int64)
        if len(lab) and (lab.min() < 0 or lab.max() >= info.num_classes):
            raise DataError(
                f"dataset {info.name!r}: labels must lie in [0, {info.num_classes}), found [{lab.min()}, {lab.max()}]"
            )
        out["label"] = lab
    if not info.in_memory:
        path = frame["path"]
        if path.isna().any():
            raise DataError(f"dataset {info.name!r}: path column has missing values")
        out["path"] = path.astype(str).to_numpy(dtype=object)
    for col in frame.columns:
        if col not in out.columns:
            out[col] = frame[col].to_numpy()
    return out


def _check_arrays(info: DatasetInfo, arrays: Mapping[str, np.ndarray], counts: Mapping[str, int]) -> None:
    unexpected = sorted(set(arrays) - {"x_train", "x_test"})
    if unexpected:
        raise DataError(f"dataset {info.name!r}: unexpected arrays {unexpected} (only x_train, x_test)")
    h, w = info.image_size
    for split, n in counts.items():
        key = f"x_{split}"
        x = arrays.get(key)
        if x is None:
            raise DataError(f"dataset {info.name!r}: in-memory sets need arrays[{key!r}]")
        want = (n, h, w, info.channels)
        if x.dtype != np.uint8 or x.shape != want:
            raise DataError(f"dataset {info.name!r}: {key} must be uint8 {want}, got {x.dtype} {x.shape}")


class PreparedDataset:
    """A prepared artifact, read back: metadata, index, labels, images or file paths."""

    def __init__(self, out_dir: Path, meta: dict[str, Any], info: DatasetInfo, index: pd.DataFrame) -> None:
        self.out_dir = out_dir
        self.meta = meta
        self.info = info
        self.index = index
        self._arrays: dict[str, np.ndarray] | None = None

    def __repr__(self) -> str:
        return (
            f"PreparedDataset({self.meta['name']!r}, n_train={self.meta['n_train']}, "
            f"n_test={self.meta['n_test']}, out_dir={str(self.out_dir)!r})"
        )

    def split_frame(self, split: str) -> pd.DataFrame:
        """The index rows of ``split``, in sample_id order."""
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        rows = self.index[self.index["split"] == split]
        if not rows["sample_id"].is_monotonic_increasing:
            rows = rows.sort_values("sample_id", kind="stable")
        return rows

    def num_samples(self, split: str) -> int:
        """Number of samples in ``split`` (from meta.json)."""
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        return int(self.meta[f"n_{split}"])

    def labels(self, split: str) -> np.ndarray:
        """int64 (n,) for single-label sets, uint8 (n, C) for multi-label sets, in sample_id order."""
        rows = self.split_frame(split)
        # copy=True: pandas' copy-on-write hands out read-only views, which torch warns about
        # (once per job) when it wraps them; labels are small, a copy costs nothing
        if self.meta["multi_label"]:
            return rows[label_columns(self.meta)].to_numpy(np.uint8, copy=True)
        return rows["label"].to_numpy(np.int64, copy=True)

    def images(self, split: str) -> np.ndarray:
        """uint8 (n, H, W, C) images of an in-memory set, in sample_id order."""
        if not self.meta["in_memory"]:
            raise DataError(f"dataset {self.meta['name']!r} keeps its images on disk; use paths(split)")
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if self._arrays is None:
            path = self.out_dir / ARRAYS_FILE
            try:
                with np.load(path, allow_pickle=False) as npz:
                    self._arrays = {k: npz[k] for k in npz.files}
            except (OSError, ValueError, KeyError) as exc:
                raise DataError(f"{path}: cannot read ({exc}); prepare the dataset again") from None
        return self._arrays[f"x_{split}"]

    def paths(self, split: str) -> np.ndarray:
        """Absolute image paths (object array of str) of an on-disk set, in sample_id order."""
        if self.meta["in_memory"]:
            raise DataError(f"dataset {self.meta['name']!r} is in memory; use images(split)")
        rel = self.split_frame(split)["path"].astype(str)
        prefix = str(self.meta["raw_dir"]).rstrip("/\\") + os.sep
        absolute = rel.where(rel.str.startswith("/"), prefix + rel)
        return absolute.to_numpy(dtype=object)


def load_prepared(out_dir: str | os.PathLike) -> PreparedDataset:
    """Read an artifact written by :func:`write_prepared`; incomplete artifacts are a DataError."""
    out = Path(out_dir)
    meta_path = out / META_FILE
    if not meta_path.is_file():
        raise DataError(
            f"{out} holds no complete prepared dataset ({META_FILE} missing: never prepared, or the "
            "preparation was interrupted). Fix: run the data preparation step for it again."
        )
    try:
        meta = json.loads(meta_path.read_text())
        index = read_parquet(out / INDEX_FILE)
    except (OSError, ValueError) as exc:
        raise DataError(f"{out}: cannot read the prepared dataset ({exc}); prepare it again") from None
    n_train = int((index["split"] == "train").sum())
    if (n_train, len(index) - n_train) != (meta.get("n_train"), meta.get("n_test")):
        raise DataError(
            f"{out}: index has {n_train}/{len(index) - n_train} train/test rows but meta.json says "
            f"{meta.get('n_train')}/{meta.get('n_test')}; prepare the dataset again"
        )
    info = DATASETS.get(meta["name"])
    if info is None:
        info = _info_from_meta(meta)
    else:
        # The artifact is the truth where it differs from the registry: ChestX-ray14 selects its
        # 8 classes from the data; synthetic stand-ins may be built at another image size.
        changes = {}
        if tuple(meta.get("class_names", info.class_names)) != info.class_names:
            changes["class_names"] = tuple(meta["class_names"])
        if tuple(meta.get("image_size", info.image_size)) != tuple(info.image_size):
            changes["image_size"] = tuple(meta["image_size"])
        if changes:
            info = dataclasses.replace(info, **changes)
    return PreparedDataset(out, meta, info, index)


def _info_from_meta(meta: Mapping[str, Any]) -> DatasetInfo:
    """A DatasetInfo for an artifact whose dataset is not registered (e.g. a synthetic stand-in)."""

    def _not_registered(ctx: PrepareContext) -> None:
        raise ConfigError(f"dataset {meta['name']!r} is not registered; it cannot be prepared again from here")

    return DatasetInfo(
        name=meta["name"],
        num_classes=int(meta["num_classes"]),
        class_names=tuple(meta["class_names"]),
        multi_label=bool(meta["multi_label"]),
        channels=int(meta["channels"]),
        image_size=tuple(meta["image_size"]),
        in_memory=bool(meta["in_memory"]),
        source=str(meta.get("source", "")),
        papers=tuple(meta.get("papers", ())),
        prepare=_not_registered,
    )
