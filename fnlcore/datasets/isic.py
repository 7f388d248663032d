"""ISIC 2019 (skin lesions, 8 classes) as FedNoRo uses it (fednoro.md §1.2).

Source: the ISIC 2019 challenge training set, ``ISIC_2019_Training_Input.zip``
(25,331 JPEGs) and ``ISIC_2019_Training_GroundTruth.csv`` (one-hot over MEL NV
BCC AK BKL DF VASC SCC UNK), downloaded from the challenge's S3 bucket. The
publisher gives no checksums, so the sha256 of what was downloaded is recorded
in meta.json.

UNK must be all zero in the training set (it is dropped; anything else is a
DataError). Class = argmax over MEL0 NV1 BCC2 AK3 BKL4 DF5 VASC6 SCC7.

Split (spec A2; FedNoRo does not publish it): the rows of the ground-truth CSV
in file order, permuted by ``np.random.seed(0); np.random.permutation(N)``
(the author's FedIIC code does this); the first floor(0.7 N) go to train
(17,731 of 25,331), the rest to test (7,600). Rows keep the permutation order
(option ``row_order``). The split is persisted as FedNoRo expects it:
``train.csv``/``test.csv`` (``image`` + 8 one-hot columns) in the artifact folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from ..io import write_csv
from ..rng import legacy_rng
from .base import DATASETS, DatasetInfo, PrepareContext, write_prepared
from .download import RemoteFile
from .rawfiles import (
    extract_archive,
    find_missing_files,
    parse_options,
    read_extraction_marker,
    sha256_label,
)

__all__ = [
    "ISIC_CLASSES",
    "ISIC_GROUND_TRUTH",
    "ISIC_IMAGES_ZIP",
    "IsicOptions",
    "read_isic_ground_truth",
    "isic_split",
    "prepare_isic2019",
]

ISIC_CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
_GT_COLUMNS = ("image",) + ISIC_CLASSES + ("UNK",)
_BASE_URL = "https://isic-challenge-data.s3.amazonaws.com/2019/"
IMAGE_DIR = "ISIC_2019_Training_Input"

# No checksums are published for these files (none could be found); the sha256
# of the downloaded copies goes to meta.json.
ISIC_GROUND_TRUTH = RemoteFile(
    filename="ISIC_2019_Training_GroundTruth.csv", urls=(_BASE_URL + "ISIC_2019_Training_GroundTruth.csv",)
)
ISIC_IMAGES_ZIP = RemoteFile(
    filename="ISIC_2019_Training_Input.zip", urls=(_BASE_URL + "ISIC_2019_Training_Input.zip",)
)


@dataclass(frozen=True)
class IsicOptions:
    """Options of ``isic2019``.

    ``split_seed`` (0) seeds the permutation; ``train_fraction`` (0.7): the
    first floor(train_fraction * N) permuted rows are train, computed exactly
    (0.7 * 70 is 49, not float 48.99...). ``row_order``: ``"permutation"``
    (default; rows in the order the permutation lists them) or ``"file"``
    (each split sorted back into ground-truth file order). The published FedNoRo
    split files are unknown, so this choice is documented, not verified; it
    matters because FedNoRo's partitioner walks each class in row order.
    ``decoded_cache`` (true): training reads the images from a decoded cache built once at the
    size it reads them (fnlcore.datasets.decoded_cache, rules/cache.smk); false decodes every epoch.
    """

    split_seed: int = 0
    train_fraction: float = 0.7
    row_order: str = "permutation"
    decoded_cache: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.train_fraction < 1.0:
            raise ConfigError(f"option train_fraction must lie in (0, 1), got {self.train_fraction}")
        if self.row_order not in ("permutation", "file"):
            raise ConfigError(f"option row_order must be 'permutation' or 'file', got {self.row_order!r}")


def read_isic_ground_truth(path: str | os.PathLike) -> pd.DataFrame:
    """``image`` + the 8 one-hot class columns of the official ground truth, UNK dropped.

    Raises DataError naming the file if the header differs, UNK has a positive
    (the 2019 training set has none), or a row is not one-hot over the 8 classes.
    """
    p = Path(path)
    try:
        df = pd.read_csv(p, dtype={"image": str})
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as ISIC_2019_Training_GroundTruth.csv ({exc})") from None
    if tuple(df.columns) != _GT_COLUMNS:
        raise DataError(f"{p}: header is {list(df.columns)}, expected {list(_GT_COLUMNS)}")
    unk = df["UNK"].to_numpy(dtype=np.float64)
    if (unk != 0).any():
        raise DataError(
            f"{p}: UNK is 1 for {int((unk != 0).sum())} images (first: {df['image'][unk != 0].iloc[0]}); "
            "the 2019 training ground truth has none. FedNoRo keeps 8 classes and drops UNK, so this file "
            "is not the official training ground truth"
        )
    onehot = df.loc[:, list(ISIC_CLASSES)].to_numpy(dtype=np.float64)
    ok = np.isin(onehot, (0.0, 1.0)).all(axis=1) & (onehot.sum(axis=1) == 1)
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise DataError(f"{p}: data row {bad} ({df['image'].iloc[bad]}) is not one-hot over {ISIC_CLASSES}")
    if df["image"].duplicated().any():
        raise DataError(f"{p}: image {df['image'][df['image'].duplicated()].iloc[0]} appears twice")
    return df.loc[:, ["image", *ISIC_CLASSES]]


def isic_split(n: int, seed: int = 0, train_fraction: float = 0.7) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows): ``RandomState(seed).permutation(n)``, first floor(train_fraction * n) train."""
    perm = legacy_rng(seed).permutation(n)
    n_train = int(Fraction(str(train_fraction)) * n)  # floor, exact for decimal fractions
    return perm[:n_train].astype(np.int64), perm[n_train:].astype(np.int64)


def prepare_isic2019(ctx: PrepareContext) -> None:
    """Prepare ISIC 2019 (see the module docstring)."""
    opts: IsicOptions = parse_options("isic2019", IsicOptions, ctx.options)
    raw = ctx.raw_dir
    gt_path = ctx.fetch(ISIC_GROUND_TRUTH)
    gt = read_isic_ground_truth(gt_path)
    rel = (IMAGE_DIR + "/" + gt["image"] + ".jpg").to_numpy(dtype=object)

    files = {gt_path.name: sha256_label(gt_path)}
    marker = read_extraction_marker(raw, ISIC_IMAGES_ZIP.filename)
    missing = find_missing_files(raw, rel)
    if marker is None and missing.any():
        zip_path = ctx.fetch(ISIC_IMAGES_ZIP, progress=True)
        marker = extract_archive(zip_path, raw, IMAGE_DIR, record={"checksum": sha256_label(zip_path)})
        missing = find_missing_files(raw, rel)
    if missing.any():
        first = ", ".join(p.rsplit("/", 1)[-1] for p in rel[missing][:5])
        raise DataError(
            f"{raw / IMAGE_DIR}: {int(missing.sum()):,} of {len(rel):,} images listed in the ground truth are "
            f"missing (first: {first}). The zip does not match the ground truth. Fix: delete "
            f"{raw / '.extracted'} and {raw / ISIC_IMAGES_ZIP.filename} and run again."
        )
    files[ISIC_IMAGES_ZIP.filename] = marker["checksum"] if marker else "unknown (images placed by hand)"

    labels = gt.loc[:, list(ISIC_CLASSES)].to_numpy().argmax(axis=1).astype(np.int64)
    train_rows, test_rows = isic_split(len(gt), opts.split_seed, opts.train_fraction)
    if opts.row_order == "file":
        train_rows, test_rows = np.sort(train_rows), np.sort(test_rows)

    parts = []
    for split, rows in (("train", train_rows), ("test", test_rows)):
        parts.append(
            pd.DataFrame(
                {
                    "sample_id": np.arange(len(rows), dtype=np.int64),
                    "split": split,
                    "label": labels[rows],
                    "path": rel[rows],
                    "image_id": gt["image"].to_numpy(dtype=object)[rows],
                }
            )
        )
        # FedNoRo's dataset class reads <root>/train.csv, <root>/test.csv: image + 8 one-hot columns.
        write_csv(gt.iloc[rows], ctx.out_dir / f"{split}.csv")
    index = pd.concat(parts, ignore_index=True)
    extra = {
        "split_seed": opts.split_seed,
        "train_fraction": opts.train_fraction,
        "row_order": opts.row_order,
        "class_counts": np.bincount(labels, minlength=len(ISIC_CLASSES)).tolist(),
        "expected_class_counts": [4522, 12875, 3323, 867, 2624, 239, 253, 628],
        "split_files": ["train.csv", "test.csv"],
    }
    write_prepared(ctx.out_dir, ISIC2019, index, None, extra, raw_dir=raw, files=files)


ISIC2019 = DATASETS.register(
    DatasetInfo(
        name="isic2019",
        num_classes=8,
        class_names=ISIC_CLASSES,
        multi_label=False,
        channels=3,
        image_size=(224, 224),  # Resize((224, 224)) in FedNoRo
        in_memory=False,
        source="ISIC 2019 challenge training set, https://challenge.isic-archive.com/data/#2019 (" + _BASE_URL + ")",
        papers=("fednoro",),
        prepare=prepare_isic2019,
        split_sizes=(17_731, 7_600),  # the seed-0 7:3 split of the 25,331 images (fednoro.md §1.2)
        manual=False,
    )
)
