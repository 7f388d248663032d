"""Clothing1M (Xiao et al., CVPR 2015) as FedCorr/FedDiv/FedGR use it (fedcorr.md §1).

Clothing1M is given out by its authors on request, so its files are placed by
hand: ``noisy_label_kv.txt`` and ``clean_label_kv.txt`` (``<key> <label>`` per
line, key = image path such as ``images/0/00/123.jpg``), the key lists
``noisy_train_key_list.txt`` and ``clean_test_key_list.txt`` (one key per line)
and the ``images/`` tree. Train = the noisy-train keys with their noisy labels
(no synthetic noise), test = the clean-test keys with their clean labels, both
in key-list order. 14 classes (the dataset's category list).

Images stay on disk; ``image_size`` (224 x 224) is the network input. How they
are read is the training setting ``image_transform`` (fnlcore/image_transforms.py):
the Clothing1M tables use the papers' codes, ``resize_crop`` (FedCorr, FedDiv
Table 5: train Resize((256, 256)) then RandomCrop(224) + flip on the device,
test Resize((224, 224))) or ``resize_crop_center`` (FedGR Tables 3/16: test
Resize(256) + CenterCrop(224); FedGR's strong view RandomResizedCrop(224) of the
256 x 256 resize); ``resize`` reads every split straight at 224 x 224.

The label files have a million lines; they are parsed with pandas (C parser,
``sep=' '``) and joined with index look-ups, never line by line in Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError, MissingManualDataError
from .base import DATASETS, DatasetInfo, PrepareContext, write_prepared
from .rawfiles import (
    describe_missing_images,
    find_missing_files,
    missing_manual_data,
    parse_options,
    sha256_label,
)

__all__ = [
    "CLOTHING1M_CLASSES",
    "CLOTHING1M_FILES",
    "Clothing1MOptions",
    "read_label_kv",
    "read_key_list",
    "labels_for_keys",
    "prepare_clothing1m",
]

CLOTHING1M_CLASSES = (
    "T-Shirt", "Shirt", "Knitwear", "Chiffon", "Sweater", "Hoodie", "Windbreaker",
    "Jacket", "Down Coat", "Suit", "Shawl", "Dress", "Vest", "Underwear",
)  # fmt: skip
NOISY_KV, CLEAN_KV = "noisy_label_kv.txt", "clean_label_kv.txt"
TRAIN_KEYS, TEST_KEYS = "noisy_train_key_list.txt", "clean_test_key_list.txt"
CLOTHING1M_FILES = (NOISY_KV, CLEAN_KV, TRAIN_KEYS, TEST_KEYS)
IMAGE_DIR = "images"
SOURCE = (
    "Clothing1M (Xiao et al., 'Learning from Massive Noisy Labeled Data for Image Classification', CVPR 2015), "
    "https://github.com/Cysu/noisy_label"
)
ACCESS = "by request: e-mail the dataset authors (see the URL above) and accept their terms; they send a download link"


@dataclass(frozen=True)
class Clothing1MOptions:
    """Options of ``clothing1m`` (the split is fixed by the key lists).

    ``decoded_cache`` (true): training reads the images from a decoded cache built once at the
    size it reads them (fnlcore.datasets.decoded_cache, rules/cache.smk); false decodes every epoch.
    """

    decoded_cache: bool = True


def read_label_kv(path: str | os.PathLike) -> pd.Series:
    """``<key> <label>`` lines -> Series label (int64) indexed by key.

    A key listed twice keeps its last label (what building a dict from the
    lines gives). Labels must lie in 0..13; DataError names the file otherwise.
    """
    p = Path(path)
    try:
        df = pd.read_csv(p, sep=" ", header=None, names=["key", "label"], dtype={"key": str}, quoting=3)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as '<key> <label>' lines ({exc})") from None
    if df["label"].isna().any() or not pd.api.types.is_integer_dtype(df["label"]):
        raise DataError(f"{p}: every line must be '<image key> <integer label>'")
    lab = df["label"].to_numpy(np.int64)
    if len(lab) and (lab.min() < 0 or lab.max() >= len(CLOTHING1M_CLASSES)):
        raise DataError(f"{p}: labels must lie in 0..{len(CLOTHING1M_CLASSES) - 1}, found {lab.min()}..{lab.max()}")
    df = df.drop_duplicates("key", keep="last")
    return pd.Series(df["label"].to_numpy(np.int64), index=pd.Index(df["key"].to_numpy(dtype=object)), name=p.name)


def read_key_list(path: str | os.PathLike) -> np.ndarray:
    """One key per line -> object array of keys, in file order."""
    p = Path(path)
    try:
        df = pd.read_csv(p, sep=" ", header=None, names=["key"], dtype=str, quoting=3)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as one image key per line ({exc})") from None
    if df["key"].isna().any():
        raise DataError(f"{p}: empty key on a line")
    return df["key"].to_numpy(dtype=object)


def labels_for_keys(labels: pd.Series, keys: np.ndarray, what: str) -> np.ndarray:
    """Labels of ``keys`` (vectorised look-up); a key without a label is a DataError naming ``what``."""
    pos = labels.index.get_indexer(keys)
    if (pos < 0).any():
        miss = keys[pos < 0]
        raise DataError(f"{what}: {len(miss):,} keys have no label in {labels.name} (first: {miss[0]})")
    return labels.to_numpy()[pos]


def prepare_clothing1m(ctx: PrepareContext) -> None:
    """Prepare Clothing1M (see the module docstring)."""
    parse_options("clothing1m", Clothing1MOptions, ctx.options)
    raw = ctx.raw_dir
    missing = [f"{raw / f} (file)" for f in CLOTHING1M_FILES if not (raw / f).is_file()]
    if not (raw / IMAGE_DIR).is_dir():
        missing.append(f"{raw / IMAGE_DIR}/ (folder does not exist)")
    if missing:
        raise _missing(raw, missing)

    parts = []
    for split, key_file, kv_file in (("train", TRAIN_KEYS, NOISY_KV), ("test", TEST_KEYS, CLEAN_KV)):
        keys = read_key_list(raw / key_file)
        labels = labels_for_keys(read_label_kv(raw / kv_file), keys, str(raw / key_file))
        parts.append(
            pd.DataFrame(
                {"sample_id": np.arange(len(keys), dtype=np.int64), "split": split, "label": labels, "path": keys}
            )
        )
    index = pd.concat(parts, ignore_index=True)
    rel = index["path"].to_numpy(dtype=object)
    escapes = pd.Series(rel).str.contains(r"^/|(?:^|/)\.\.(?:/|$)", regex=True).to_numpy()
    bad = rel[escapes]
    if len(bad):
        raise DataError(f"{raw}: image keys must be relative paths inside the dataset folder, found {bad[0]!r}")
    absent = find_missing_files(raw, rel)
    if absent.any():
        raise _missing(raw, [describe_missing_images(IMAGE_DIR, rel, absent, raw)])
    files = {f: sha256_label(raw / f) for f in CLOTHING1M_FILES}
    extra = {"label_source": {"train": f"{TRAIN_KEYS} + {NOISY_KV}", "test": f"{TEST_KEYS} + {CLEAN_KV}"}}
    write_prepared(ctx.out_dir, CLOTHING1M, index, None, extra, raw_dir=raw, files=files)


def _missing(raw: Path, missing: list[str]) -> MissingManualDataError:
    return missing_manual_data(
        "clothing1m",
        raw,
        missing,
        source=SOURCE,
        access=ACCESS,
        layout=[
            f"{NOISY_KV}   (<key> <noisy label> per line)",
            f"{CLEAN_KV}   (<key> <clean label> per line)",
            f"{TRAIN_KEYS}   (training keys, one per line)",
            f"{TEST_KEYS}   (test keys, one per line)",
            f"{IMAGE_DIR}/<a>/<bc>/<name>.jpg   (the image tree; keys are paths relative to this folder's parent)",
        ],
    )


CLOTHING1M = DATASETS.register(
    DatasetInfo(
        name="clothing1m",
        num_classes=14,
        class_names=CLOTHING1M_CLASSES,
        multi_label=False,
        channels=3,
        image_size=(224, 224),
        in_memory=False,
        source=SOURCE,
        papers=("fedgr", "feddiv"),
        prepare=prepare_clothing1m,
        split_sizes=(1_000_000, 10_526),  # noisy-train keys / clean-test keys (feddiv.md, fedgr.md)
        manual=True,
    )
)
